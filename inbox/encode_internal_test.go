package inbox

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/millrace/millrace/internal/pgtest"
)

// The marks' event ids encode as a uuid[] without a detour through text: a
// handful of allocations per id (a uuid.UUID's driver.Valuer took more
// than twenty, and an error built for each).
func TestEventIDsEncodeDirectly(t *testing.T) {
	msgs := make([]*message.Message, 50)
	for i := range msgs {
		msgs[i] = message.NewMessage(uuid.NewString(), nil)
	}
	ids, err := (&Deduplicator{eventID: DefaultEventID}).eventIDs(msgs)
	if err != nil {
		t.Fatal(err)
	}
	if a := pgtest.EncodeAllocs(t, pgtype.UUIDArrayOID, ids) / float64(len(msgs)); a > 5 {
		t.Errorf("%.1f allocations per event id; want at most 5", a)
	}
}
