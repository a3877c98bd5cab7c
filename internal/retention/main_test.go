package retention

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// newCleaner returns a Cleaner on db's schema with cfg, its batches of
// the given sizes (0: the package's).
func newCleaner(t testing.TB, db *pgtest.DB, cfg Config, batch batchSizes) *Cleaner {
	t.Helper()
	cfg.Schema = db.Schema
	c, err := New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ size, into *int }{
		{&batch.events, &c.batch.events}, {&batch.marks, &c.batch.marks},
		{&batch.barrier, &c.batch.barrier}, {&batch.sagas, &c.batch.sagas}, {&batch.audit, &c.batch.audit},
	} {
		if *b.size > 0 {
			*b.into = *b.size
		}
	}
	return c
}

// pass runs one Pass and fails the test on its error.
func pass(t testing.TB, c *Cleaner) Removed {
	t.Helper()
	r, err := c.Pass(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runUntil runs c.Run until done holds, then cancels it and checks that
// Run returned nil at once.
func runUntil(t testing.TB, c *Cleaner, what string, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	waitFor(t, 30*time.Second, what, func() bool {
		select {
		case err := <-ran:
			t.Fatalf("Run returned %v before %s", err, what)
		default:
		}
		return done()
	})
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// count runs a count(*) query; {t} in sql is replaced with db's table t,
// as in {saga_instance}.
func count(t testing.TB, db *pgtest.DB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), tables(db, sql), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// exec runs sql, {t} replaced as in count.
func exec(t testing.TB, db *pgtest.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), tables(db, sql), args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func tables(db *pgtest.DB, sql string) string {
	var r []string
	for _, name := range []string{"outbox_event", "outbox_pending", "processed_event", "inbox_event", "compensation_barrier",
		"saga_instance", "saga_history", "saga_event", "saga_bulk_item", "saga_bulk_operation", "audit_log", "saga_attr"} {
		r = append(r, "{"+name+"}", sqlident.Table(db.Schema, name))
	}
	return strings.NewReplacer(r...).Replace(sql)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 1})
	if _, err := New(nil, Config{Schema: db.Schema}); !errors.Is(err, core.ErrConfig) {
		t.Errorf("nil pool: %v, want ErrConfig", err)
	}
	for _, cfg := range []Config{{}, {Schema: "Bad-Name"}, {Schema: "bad;"}} {
		if _, err := New(db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
	for field, cfg := range map[string]Config{
		"Events": {Events: -time.Second}, "Marks": {Marks: -1}, "Barrier": {Barrier: -1},
		"Completed": {Completed: -1}, "Compensated": {Compensated: -1}, "Interval": {Interval: -time.Second}, "Audit": {Audit: -1},
	} {
		cfg.Schema = db.Schema
		if _, err := New(db.Pool, cfg); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("negative %s: %v, want ErrConfig naming it", field, err)
		}
	}
	c, err := New(db.Pool, Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Schema: db.Schema, Events: DefaultEvents, Marks: DefaultMarks, Barrier: DefaultBarrier,
		Completed: DefaultCompleted, Compensated: DefaultCompensated, Audit: DefaultAudit, Interval: DefaultInterval}
	got := c.cfg
	got.Logger = nil
	if got != want {
		t.Errorf("defaults %+v, want %+v", got, want)
	}
	if c.cfg.Logger == nil {
		t.Error("no default logger")
	}
	day := 24 * time.Hour
	for name, d := range map[string]time.Duration{"DefaultEvents": DefaultEvents, "DefaultMarks": DefaultMarks,
		"DefaultBarrier": DefaultBarrier, "DefaultCompleted": DefaultCompleted} {
		if d != 7*day {
			t.Errorf("%s = %s, want 7 days", name, d)
		}
	}
	if DefaultCompensated != 30*day || DefaultInterval != time.Minute || DefaultAudit != 90*day {
		t.Errorf("DefaultCompensated = %s, DefaultInterval = %s; want 30 days, 1 minute", DefaultCompensated, DefaultInterval)
	}
}

// opsActor is who the tests' operator actions are recorded as.
var opsActor = core.Actor{Operator: "ops", Reason: "test"}
