package outbox_test

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

func newCleaner(t *testing.T, b *opsBundle, cfg outbox.CleanerConfig) *outbox.Cleaner {
	t.Helper()
	cfg.Schema = b.db.Schema
	c, err := outbox.NewCleaner(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logIDs returns the event ids left in the log, in row order.
func (b *opsBundle) logIDs() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, b.sql(`SELECT event_id::text FROM {event} ORDER BY id`))
	if err != nil {
		b.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return ids
}

// discarded discards events as an operator would, at the given time.
func (b *opsBundle) discarded(at time.Time, eventIDs ...string) {
	b.t.Helper()
	for _, id := range eventIDs {
		b.fail(id, "boom", 10, true)
	}
	if n, err := b.admin.Discard(b.ctx, eventIDs...); err != nil || n != len(eventIDs) {
		b.t.Fatalf("Discard = %d, %v", n, err)
	}
	b.exec(`UPDATE {event} SET discarded_at = $2 WHERE event_id = ANY($1::uuid[])`, eventIDs, at)
}

func TestNewCleanerValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := outbox.NewCleaner(nil, outbox.CleanerConfig{}); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := outbox.NewCleaner(db.Pool, outbox.CleanerConfig{Schema: "Bad-Name"}); err == nil {
		t.Error("bad schema accepted")
	}
	for _, cfg := range []outbox.CleanerConfig{{Retention: -time.Second}, {BatchSize: -1}, {Interval: -time.Second}} {
		if _, err := outbox.NewCleaner(db.Pool, cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

func TestCleanerDeletesOnlyWhatRetentionReleased(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	now := time.Now()
	old := now.Add(-3 * time.Hour)
	events := make([]outbox.Event, 16)
	for i := range events {
		events[i] = opsEvent("t", fmt.Sprint("k", i))
	}
	ids := b.write(events...)
	b.created(old, ids...)

	// Kept, and placed first in created_at order so that every batch has
	// to pass them: an unpublished backlog older than the retention period,
	// a dead letter, a failing event.
	b.created(old.Add(-time.Hour), ids[0], ids[1], ids[2])
	b.fail(ids[1], "boom", 10, true)
	b.fail(ids[2], "retrying", 2, false)
	// Deleted: published two hours ago (8 of them, in batches of 3).
	releasedPub := ids[3:11]
	b.publish(now.Add(-2*time.Hour), releasedPub...)
	// Deleted: discarded two hours ago.
	b.discarded(now.Add(-2*time.Hour), ids[11])
	// Kept: created long ago but published or discarded recently.
	b.publish(now.Add(-10*time.Minute), ids[12])
	b.discarded(now.Add(-10*time.Minute), ids[13])
	// Kept: published long ago and queued for replay.
	b.publish(now.Add(-2*time.Hour), ids[14])
	if n, err := b.admin.Replay(b.ctx, outbox.ReplayFilter{FromID: b.rowID(ids[14]), ToID: b.rowID(ids[14])}); err != nil || n != 1 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	// Kept: new and published.
	b.created(now, ids[15])
	b.publish(now, ids[15])

	c := newCleaner(t, b, outbox.CleanerConfig{Retention: time.Hour, BatchSize: 3})
	n, err := c.CleanOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{ids[0], ids[1], ids[2], ids[12], ids[13], ids[14], ids[15]}
	if got := b.logIDs(); n != 9 || !slices.Equal(got, want) {
		t.Fatalf("CleanOnce deleted %d, left %v; want 9 deleted, left %v", n, got, want)
	}
	if n, err := c.CleanOnce(b.ctx); err != nil || n != 0 {
		t.Errorf("second CleanOnce = %d, %v; want 0", n, err)
	}
	// The states of what was kept are untouched.
	if dl, err := b.admin.List(b.ctx, core.ListParams{}); err != nil || len(dl) != 1 || dl[0].EventID != ids[1] {
		t.Errorf("dead letters after cleaning = %v, %v", dl, err)
	}
	if got := b.pendingIDs(); !slices.Equal(got, []string{ids[0], ids[1], ids[2], ids[14]}) {
		t.Errorf("pending after cleaning = %v", got)
	}

	// With the default retention (7 days) nothing here is old enough.
	b.publish(now.Add(-2*time.Hour), ids[0])
	def := newCleaner(t, b, outbox.CleanerConfig{})
	if n, err := def.CleanOnce(b.ctx); err != nil || n != 0 {
		t.Errorf("default retention deleted %d, %v", n, err)
	}
}

// Cleaners running at once delete every due row exactly once between them.
func TestCleanersRunConcurrently(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	events := make([]outbox.Event, 200)
	for i := range events {
		events[i] = opsEvent("t", fmt.Sprint("k", i%7))
	}
	ids := b.write(events...)
	b.created(time.Now().Add(-2*time.Hour), ids...)
	b.publish(time.Now().Add(-2*time.Hour), ids...)
	cfg := outbox.CleanerConfig{Retention: time.Hour, BatchSize: 7}
	cleaners := []*outbox.Cleaner{newCleaner(t, b, cfg), newCleaner(t, b, cfg), newCleaner(t, b, cfg)}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int64
	)
	for _, c := range cleaners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := c.CleanOnce(b.ctx)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	// A cleaner stops at a short batch, which SKIP LOCKED can cause while
	// another holds rows; one more pass takes what is left.
	n, err := cleaners[0].CleanOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if total+n != int64(len(ids)) {
		t.Errorf("deleted %d + %d, want %d", total, n, len(ids))
	}
	if left := b.logIDs(); len(left) != 0 {
		t.Errorf("%d rows left", len(left))
	}
}

func TestCleanerRunCleansEveryIntervalAndStops(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	c := newCleaner(t, b, outbox.CleanerConfig{Retention: time.Hour, BatchSize: 2, Interval: 20 * time.Millisecond})
	oldPublished := func() []string {
		ids := b.write(opsEvent("t", "a"), opsEvent("t", "b"), opsEvent("t", "c"))
		b.created(time.Now().Add(-2*time.Hour), ids...)
		b.publish(time.Now().Add(-2*time.Hour), ids...)
		return ids
	}
	waitEmpty := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); len(b.logIDs()) > 0; {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the log still holds %d rows", what, len(b.logIDs()))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	oldPublished()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitEmpty("first pass")
	oldPublished() // written after the first pass: a later pass takes them
	waitEmpty("later pass")

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
