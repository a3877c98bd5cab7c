package outbox

import (
	"context"
	"testing"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// The CDC relay's statements on the log's primary key keep one plan each:
// with "id = ANY($1)" PostgreSQL planned the mark again at 199 of 448
// executions (the bench's cdc group, quick), a plan of 0.1 ms each.
func TestCDCStatementsKeepTheirGenericPlans(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 4})
	c, err := NewCDCRelay(db.Pool, CDCRelayConfig{RelayConfig: RelayConfig{Schema: db.Schema, Publisher: discard{}}})
	if err != nil {
		t.Fatal(err)
	}
	// On an empty table any plan is as cheap as the generic one.
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO `+sqlident.Table(db.Schema, "outbox_event")+` (event_id, topic, partition_key, lane, payload)
SELECT gen_random_uuid(), 'orders', 'k' || g, 0, '{}' FROM generate_series(1, 5000) g;
ANALYZE `+sqlident.Table(db.Schema, "outbox_event")); err != nil {
		t.Fatal(err)
	}
	ids := []int64{7, 3, 11}
	for name, sql := range map[string]string{"mark": c.sql.mark, "visible": c.sql.visible, "visibleIDs": c.sql.visibleIDs, "divert": c.sql.divert} {
		t.Run(name, func(t *testing.T) { db.CheckKeepsGenericPlan(t, sql, "outbox_event_pkey", ids) })
	}
}
