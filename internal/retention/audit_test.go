package retention

import (
	"context"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/pgtest"
)

// The audit trail is kept for its own window (90 days by default): a pass
// removes the entries recorded before it, in batches, and keeps the
// others, whatever the other windows say.
func TestAuditTrailRetention(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	trail := audit.New(db.Schema)
	e := audit.Entry{Actor: opsActor, Action: "outbox.discard", Kind: audit.KindOutbox}
	for range 7 {
		if err := trail.Write(ctx, db.Pool, e, e, e); err != nil {
			t.Fatal(err)
		}
	}
	// 15 of the 21 entries are 100 days old, 3 are 80 days old, 3 new.
	exec(t, db, `UPDATE {audit_log} SET at = now() - interval '100 days' WHERE id IN (SELECT id FROM {audit_log} ORDER BY id LIMIT 15)`)
	exec(t, db, `UPDATE {audit_log} SET at = now() - interval '80 days' WHERE id IN (SELECT id FROM {audit_log} ORDER BY id OFFSET 15 LIMIT 3)`)

	c := newCleaner(t, db, Config{Events: time.Hour, Compensated: time.Hour, Completed: time.Hour}, batchSizes{audit: 4})
	if r := pass(t, c); r.Audit != 15 {
		t.Errorf("removed %+v, want the 15 entries older than 90 days", r)
	}
	if n := count(t, db, `SELECT count(*) FROM {audit_log}`); n != 6 {
		t.Errorf("%d entries left, want 6", n)
	}
	c = newCleaner(t, db, Config{Audit: 30 * 24 * time.Hour}, batchSizes{})
	if r := pass(t, c); r.Audit != 3 || count(t, db, `SELECT count(*) FROM {audit_log}`) != 3 {
		t.Errorf("with a 30-day window removed %+v, want the 3 entries of 80 days", r)
	}
}
