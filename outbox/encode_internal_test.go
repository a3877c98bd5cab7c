package outbox

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/millrace/millrace/internal/pgtest"
)

// The insert's event ids encode as a uuid[] without a detour through text:
// a handful of allocations per id (a uuid.UUID's driver.Valuer took more
// than twenty, and an error built for each).
func TestEventIDsEncodeDirectly(t *testing.T) {
	rows := make([]eventRow, 50)
	for i := range rows {
		rows[i].id = uuid.New()
	}
	if a := pgtest.EncodeAllocs(t, pgtype.UUIDArrayOID, columns(rows)[0]) / float64(len(rows)); a > 5 {
		t.Errorf("%.1f allocations per event id; want at most 5", a)
	}
}
