package retention

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// Run fails at once, naming the schema, when any table a pass works on is
// missing: on a schema with no tables, and on one that lacks only the last
// table a pass reaches.
func TestRunFailsAtOnceWithoutTheTables(t *testing.T) {
	t.Parallel()
	bare := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 2})
	partial := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	exec(t, partial, `DROP TABLE {saga_bulk_item}`)
	for name, db := range map[string]*pgtest.DB{"no tables": bare, "no saga_bulk_item": partial} {
		c := newCleaner(t, db, Config{Interval: time.Millisecond}, batchSizes{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := c.Run(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		if err == nil || timedOut || !strings.Contains(err.Error(), db.Schema) || !strings.Contains(err.Error(), "migrations applied?") {
			t.Errorf("%s: Run = %v, want an error at once naming schema %s", name, err, db.Schema)
		}
	}
}

// One pass removes every kind, and counts each; a kind whose statement
// fails does not keep the others from being cleaned, and the error names
// it.
func TestPassCleansEveryKindAndGoesOnPastAFailure(t *testing.T) {
	t.Parallel()
	seed := func(db *pgtest.DB) {
		exec(t, db, `
INSERT INTO {outbox_event} (event_id, topic, partition_key, payload, lane, created_at, published_at)
VALUES (gen_random_uuid(), 't', 'k', '{}', 0, now() - interval '40 days', now() - interval '40 days');
INSERT INTO {processed_event} (consumer, event_id, processed_at) VALUES ('c', gen_random_uuid(), now() - interval '40 days');
INSERT INTO {inbox_event} (consumer, event_id, payload, processed, processed_at, received_at)
VALUES ('c', gen_random_uuid(), '\x00', true, now() - interval '40 days', now() - interval '40 days');
INSERT INTO {compensation_barrier} (saga_id, step, operation, outcome, created_at, updated_at)
VALUES ('s', 'credit', 'action', 'success', now() - interval '40 days', now() - interval '40 days'),
       ('s', 'credit', 'compensation', 'success', now() - interval '40 days', now() - interval '40 days');
INSERT INTO {saga_bulk_operation} (id, action, query, operator, reason, created_at, selected)
VALUES ('op', 'retry', '{}', 'alice', 'test', now() - interval '40 days', 0);`)
		insertSagas(t, db, []testSaga{{id: "s", status: saga.StatusCompensated, endedAge: 40 * 24 * time.Hour, history: 2}})
	}
	all := Removed{Events: 1, Marks: 1, Inbox: 1, Barrier: 2, Sagas: 1, Bulk: 1}

	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	seed(db)
	c := newCleaner(t, db, Config{}, batchSizes{})
	if r := pass(t, c); r != all {
		t.Fatalf("Pass removed %+v, want %+v", r, all)
	}

	broken := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	seed(broken)
	exec(t, broken, `DROP TABLE {outbox_pending}`)
	r, err := newCleaner(t, broken, Config{}, batchSizes{}).Pass(context.Background())
	want := all
	want.Events = 0
	if r != want || err == nil || !strings.Contains(err.Error(), "outbox events") {
		t.Fatalf("Pass without outbox_pending = %+v, %v; want %+v and an error naming the outbox events", r, err, want)
	}
}

// lockedBuffer is a bytes.Buffer for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With no Logger, a failed pass of Run is logged to slog.Default(). Not
// parallel: it replaces slog's default logger (parallel tests start after
// it ends).
func TestNoLoggerLogsErrorsToSlogDefault(t *testing.T) {
	var buf lockedBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	// Run fails at start on a schema without tables (and returns that), so
	// a table goes once the passes are under way: every pass fails after
	// that.
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	c := newCleaner(t, db, Config{Interval: 10 * time.Millisecond}, batchSizes{})
	var batches atomic.Int64
	c.afterSagaBatch = func(int, time.Duration) { batches.Add(1) } // set before Run starts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	waitFor(t, 30*time.Second, "the passes to be under way", func() bool { return batches.Load() >= 4 })
	exec(t, db, `DROP TABLE {compensation_barrier}`)
	waitFor(t, 30*time.Second, "a failed pass on slog.Default()", func() bool {
		out := buf.String()
		return strings.Contains(out, "level=ERROR") && strings.Contains(out, "component=retention") &&
			strings.Contains(out, "barrier rows")
	})
}
