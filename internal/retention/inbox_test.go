package retention

import (
	"testing"

	"github.com/millrace/millrace/internal/pgtest"
)

// A pass removes dedup marks and processed inbox rows older than the Marks
// window, in batches, and keeps the rest: recent marks, and unprocessed
// rows whatever their age.
func TestPassRemovesOldMarksAndProcessedInboxRows(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	exec(t, db, `
INSERT INTO {processed_event} (consumer, event_id, processed_at)
SELECT 'c', gen_random_uuid(), now() - CASE WHEN g <= 25 THEN interval '8 days' ELSE interval '1 hour' END
  FROM generate_series(1, 30) g;
INSERT INTO {inbox_event} (consumer, event_id, payload, processed, processed_at, received_at)
SELECT 'c', gen_random_uuid(), '\x00', g <= 15, CASE WHEN g <= 15 THEN now() - interval '9 days' END, now() - interval '10 days'
  FROM generate_series(1, 20) g;`)
	c := newCleaner(t, db, Config{}, batchSizes{marks: 4})
	if r := pass(t, c); r != (Removed{Marks: 25, Inbox: 15}) {
		t.Fatalf("Pass removed %+v; want 25 marks and 15 inbox rows", r)
	}
	if got := count(t, db, `SELECT count(*) FROM {processed_event}`); got != 5 {
		t.Fatalf("marks left %d, want 5", got)
	}
	if got := count(t, db, `SELECT count(*) FROM {inbox_event} WHERE NOT processed`); got != 5 {
		t.Fatalf("unprocessed rows left %d, want 5", got)
	}
	if got := count(t, db, `SELECT count(*) FROM {inbox_event}`); got != 5 {
		t.Fatalf("inbox rows left %d, want the 5 unprocessed", got)
	}
	// Run makes a pass at once and stops cleanly at the end.
	exec(t, db, `UPDATE {processed_event} SET processed_at = now() - interval '8 days'`)
	runUntil(t, c, "Run to remove the marks aged past the window", func() bool {
		return count(t, db, `SELECT count(*) FROM {processed_event}`) == 0
	})
}
