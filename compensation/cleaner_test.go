package compensation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
)

func TestCleanerConfig(t *testing.T) {
	t.Parallel()
	if _, err := compensation.NewCleaner(nil, compensation.CleanerConfig{}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nil pool: %v", err)
	}
	b := setup(t, 2)
	for _, cfg := range []compensation.CleanerConfig{{Schema: "Bad;"}, {Window: -1}, {BatchSize: -1}, {Interval: -1}} {
		cfg := cfg
		if cfg.Schema == "" {
			cfg.Schema = b.db.Schema
		}
		if _, err := compensation.NewCleaner(b.db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
}

// The cleaner removes the rows of sagas whose every row is older than the
// window, all of a saga's rows together, and nothing else.
func TestCleanerRemovesOnlyEndedSagas(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ctx := context.Background()
	barrier := sqlident.Table(b.db.Schema, "compensation_barrier")
	age := func(saga, operation string, d time.Duration) {
		t.Helper()
		if _, err := b.db.Pool.Exec(ctx, `UPDATE `+barrier+` SET updated_at = now() - $3::bigint * interval '1 second', created_at = now() - $3::bigint * interval '1 second'
 WHERE saga_id = $1 AND operation = $2`, saga, operation, int64(d/time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	const window = 24 * time.Hour
	old, old2, straddling, recent, empty := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	for _, s := range []string{old, old2, straddling, recent} {
		must(t, b.handle(action(s, 1)))
		must(t, b.handle(compensationOf(s, 1)))
	}
	must(t, b.handle(compensationOf(empty, 1))) // an empty compensation: two rows, action cancelled
	for _, s := range []string{old, old2, empty} {
		age(s, core.OperationAction, 3*window)
		age(s, core.OperationCompensation, 2*window)
	}
	// The action is old, its compensation recent: the saga has not ended.
	age(straddling, core.OperationAction, 3*window)
	// A second step of old2, also old.
	must(t, b.handle(command(old2, "stock", core.OperationAction, 1, `{}`)))
	if _, err := b.db.Pool.Exec(ctx, `UPDATE `+barrier+` SET updated_at = now() - interval '30 days' WHERE saga_id = $1 AND step = 'stock'`, old2); err != nil {
		t.Fatal(err)
	}

	c, err := compensation.NewCleaner(b.db.Pool, compensation.CleanerConfig{Schema: b.db.Schema, Window: window, BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.CleanOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 7 {
		t.Fatalf("deleted %d rows, want 7 (2 + 3 + 2)", n)
	}
	rows := func(s string) int { return b.count(t, `SELECT count(*) FROM `+barrier+` WHERE saga_id = $1`, s) }
	for s, want := range map[string]int{old: 0, old2: 0, empty: 0, straddling: 2, recent: 2} {
		if got := rows(s); got != want {
			t.Fatalf("saga %s: %d rows left, want %d", s, got, want)
		}
	}
	if n, err := c.CleanOnce(ctx); err != nil || n != 0 {
		t.Fatalf("second pass: %d, %v; want 0", n, err)
	}
	// The kept barrier still decides: a late duplicate action of the
	// straddling saga does not run.
	calls := b.actionCalls.Load()
	must(t, b.handle(action(straddling, 9)))
	if b.actionCalls.Load() != calls {
		t.Fatal("the action ran again after cleaning")
	}
}

// Run cleans at once and on every interval, and stops when ctx ends.
func TestCleanerRunCleansAndStops(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	saga := uuid.NewString()
	must(t, b.handle(action(saga, 1)))
	if _, err := b.db.Pool.Exec(context.Background(), `UPDATE `+sqlident.Table(b.db.Schema, "compensation_barrier")+
		` SET updated_at = now() - interval '8 days'`); err != nil {
		t.Fatal(err)
	}
	c, err := compensation.NewCleaner(b.db.Pool, compensation.CleanerConfig{Schema: b.db.Schema, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 30*time.Second, "the default 7-day window to remove the 8-day-old saga", func() bool {
		_, _, ok := b.barrier(t, saga, core.OperationAction)
		return !ok
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}
