package inbox

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// The processor's mark of a batch's processed events keeps one plan: with
// "id = ANY($1)" PostgreSQL planned it again for most batches' ids.
func TestMarkDoneKeepsItsGenericPlan(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	p, err := NewProcessor(db.Pool, ProcessorConfig{Schema: db.Schema, Consumer: "orders",
		Handler: func(context.Context, pgx.Tx, *message.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	// On an empty table any plan is as cheap as the generic one.
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO `+sqlident.Table(db.Schema, "inbox_event")+` (consumer, event_id, payload)
SELECT 'orders', gen_random_uuid(), '' FROM generate_series(1, 5000);
ANALYZE `+sqlident.Table(db.Schema, "inbox_event")); err != nil {
		t.Fatal(err)
	}
	db.CheckKeepsGenericPlan(t, p.sql.markDone, "inbox_event_pkey", []int64{7, 3, 11})
}
