package retention

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// outboxBundle is a fresh schema, a Writer to put events in, an Admin,
// and SQL that moves events between the states the relay puts them in.
type outboxBundle struct {
	t     *testing.T
	db    *pgtest.DB
	w     *outbox.Writer
	admin *outbox.Admin
	ctx   context.Context
}

func outboxSetup(t *testing.T) *outboxBundle {
	t.Helper()
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, NotifyInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	a, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return &outboxBundle{t: t, db: db, w: w, admin: a, ctx: context.Background()}
}

// write writes n events on topic t with keys k0, k1, ... (mod keys) and
// returns their ids.
func (b *outboxBundle) write(n, keys int) []string {
	b.t.Helper()
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{Topic: "t", PartitionKey: fmt.Sprint("k", i%keys), Payload: []byte(`{"n":1}`)}
	}
	ids, err := b.w.Write(b.ctx, events...)
	if err != nil {
		b.t.Fatal(err)
	}
	return ids
}

// created sets created_at of events.
func (b *outboxBundle) created(at time.Time, eventIDs ...string) {
	b.t.Helper()
	exec(b.t, b.db, `UPDATE {outbox_event} SET created_at = $2 WHERE event_id = ANY($1::uuid[])`, eventIDs, at)
}

// publish marks events published at the given time, as the relay does.
func (b *outboxBundle) publish(at time.Time, eventIDs ...string) {
	b.t.Helper()
	exec(b.t, b.db, `WITH e AS (UPDATE {outbox_event} SET published_at = $2 WHERE event_id = ANY($1::uuid[]) RETURNING id)
DELETE FROM {outbox_pending} p USING e WHERE p.id = e.id`, eventIDs, at)
}

// fail records a failed attempt as the relay does; dead makes it a dead letter.
func (b *outboxBundle) fail(eventID, reason string, attempts int, dead bool) {
	b.t.Helper()
	exec(b.t, b.db, `WITH e AS (
    UPDATE {outbox_event} SET attempts = $2, last_error = $3, next_attempt_at = now() + interval '1 hour',
                       dead_at = CASE WHEN $4 THEN now() END
     WHERE event_id = $1 RETURNING id)
UPDATE {outbox_pending} p SET blocked = true, dead = $4, next_attempt_at = now() + interval '1 hour' FROM e WHERE p.id = e.id`,
		eventID, attempts, reason, dead)
}

// discarded discards events as an operator would, at the given time.
func (b *outboxBundle) discarded(at time.Time, eventIDs ...string) {
	b.t.Helper()
	for _, id := range eventIDs {
		b.fail(id, "boom", 10, true)
	}
	if n, err := b.admin.Discard(b.ctx, opsActor, eventIDs...); err != nil || n != len(eventIDs) {
		b.t.Fatalf("Discard = %d, %v", n, err)
	}
	exec(b.t, b.db, `UPDATE {outbox_event} SET discarded_at = $2 WHERE event_id = ANY($1::uuid[])`, eventIDs, at)
}

// rowID returns the log row id of an event.
func (b *outboxBundle) rowID(eventID string) int64 {
	b.t.Helper()
	var id int64
	if err := b.db.Pool.QueryRow(b.ctx, tables(b.db, `SELECT id FROM {outbox_event} WHERE event_id = $1`), eventID).Scan(&id); err != nil {
		b.t.Fatal(err)
	}
	return id
}

// ids returns the event ids a query selects, in its order.
func (b *outboxBundle) ids(sql string) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, tables(b.db, sql))
	if err != nil {
		b.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return ids
}

// logIDs returns the event ids left in the log, in row order.
func (b *outboxBundle) logIDs() []string {
	return b.ids(`SELECT event_id::text FROM {outbox_event} ORDER BY id`)
}

func (b *outboxBundle) pendingIDs() []string {
	return b.ids(`SELECT e.event_id::text FROM {outbox_pending} p JOIN {outbox_event} e ON e.id = p.id ORDER BY p.id`)
}

// A pass removes the events published or discarded before the window, and
// keeps an unpublished backlog, dead letters, failing events, events
// queued for replay and recently published or discarded ones, however old.
func TestPassRemovesOnlyEventsTheWindowReleased(t *testing.T) {
	t.Parallel()
	b := outboxSetup(t)
	now := time.Now()
	old := now.Add(-3 * time.Hour)
	ids := b.write(16, 16)
	b.created(old, ids...)

	// Kept, and placed first in created_at order so that every batch has
	// to pass them: an unpublished backlog older than the window, a dead
	// letter, a failing event.
	b.created(old.Add(-time.Hour), ids[0], ids[1], ids[2])
	b.fail(ids[1], "boom", 10, true)
	b.fail(ids[2], "retrying", 2, false)
	// Removed: published two hours ago (8 of them, in batches of 3).
	b.publish(now.Add(-2*time.Hour), ids[3:11]...)
	// Removed: discarded two hours ago.
	b.discarded(now.Add(-2*time.Hour), ids[11])
	// Kept: created long ago but published or discarded recently.
	b.publish(now.Add(-10*time.Minute), ids[12])
	b.discarded(now.Add(-10*time.Minute), ids[13])
	// Kept: published long ago and queued for replay.
	b.publish(now.Add(-2*time.Hour), ids[14])
	if n, err := b.admin.Replay(b.ctx, outbox.ReplayFilter{FromID: b.rowID(ids[14]), ToID: b.rowID(ids[14])}, opsActor); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	// Kept: new and published.
	b.created(now, ids[15])
	b.publish(now, ids[15])

	c := newCleaner(t, b.db, Config{Events: time.Hour}, batchSizes{events: 3})
	r := pass(t, c)
	want := []string{ids[0], ids[1], ids[2], ids[12], ids[13], ids[14], ids[15]}
	if got := b.logIDs(); r != (Removed{Events: 9}) || !slices.Equal(got, want) {
		t.Fatalf("Pass removed %+v, left %v; want 9 events removed, left %v", r, got, want)
	}
	if r := pass(t, c); r != (Removed{}) {
		t.Errorf("second Pass removed %+v; want nothing", r)
	}
	// The states of what was kept are untouched.
	if dl, err := b.admin.List(b.ctx, core.ListParams{}); err != nil || len(dl) != 1 || dl[0].EventID != ids[1] {
		t.Errorf("dead letters after the pass = %v, %v", dl, err)
	}
	if got := b.pendingIDs(); !slices.Equal(got, []string{ids[0], ids[1], ids[2], ids[14]}) {
		t.Errorf("pending after the pass = %v", got)
	}

	// With the default window (7 days) nothing here is old enough.
	b.publish(now.Add(-2*time.Hour), ids[0])
	if r := pass(t, newCleaner(t, b.db, Config{}, batchSizes{})); r != (Removed{}) {
		t.Errorf("the default window removed %+v", r)
	}
}

// Cleaners running at once remove every due event exactly once between
// them.
func TestCleanersPassConcurrently(t *testing.T) {
	t.Parallel()
	b := outboxSetup(t)
	ids := b.write(200, 7)
	b.created(time.Now().Add(-2*time.Hour), ids...)
	b.publish(time.Now().Add(-2*time.Hour), ids...)
	cfg, batch := Config{Events: time.Hour}, batchSizes{events: 7}
	cleaners := []*Cleaner{newCleaner(t, b.db, cfg, batch), newCleaner(t, b.db, cfg, batch), newCleaner(t, b.db, cfg, batch)}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
	)
	for _, c := range cleaners {
		wg.Go(func() {
			r, err := c.Pass(b.ctx)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += r.Events
			mu.Unlock()
		})
	}
	wg.Wait()
	// A cleaner stops at a short batch, which SKIP LOCKED can cause while
	// another holds rows; one more pass takes what is left.
	r := pass(t, cleaners[0])
	if total+r.Events != len(ids) {
		t.Errorf("removed %d + %d, want %d", total, r.Events, len(ids))
	}
	if left := b.logIDs(); len(left) != 0 {
		t.Errorf("%d rows left", len(left))
	}
}

// Run makes a pass at once and on every interval, and stops when its
// context ends.
func TestRunCleansEveryIntervalAndStops(t *testing.T) {
	t.Parallel()
	b := outboxSetup(t)
	c := newCleaner(t, b.db, Config{Events: time.Hour, Interval: 20 * time.Millisecond}, batchSizes{events: 2})
	oldPublished := func() {
		ids := b.write(3, 3)
		b.created(time.Now().Add(-2*time.Hour), ids...)
		b.publish(time.Now().Add(-2*time.Hour), ids...)
	}
	oldPublished()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 10*time.Second, "the first pass to empty the log", func() bool { return len(b.logIDs()) == 0 })
	oldPublished() // written after the first pass: a later pass takes them
	waitFor(t, 10*time.Second, "a later pass to empty the log", func() bool { return len(b.logIDs()) == 0 })

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}
