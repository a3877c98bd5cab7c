package saga_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/saga"
)

func TestCleanerConfig(t *testing.T) {
	t.Parallel()
	if _, err := saga.NewCleaner(nil, saga.CleanerConfig{}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nil pool: %v", err)
	}
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	for _, cfg := range []saga.CleanerConfig{{Schema: "Bad;"}, {CompletedAfter: -1}, {CompensatedAfter: -1},
		{StuckAfter: -1}, {BulkAfter: -1}, {BatchSize: -1}, {Interval: -1}} {
		if cfg.Schema == "" {
			cfg.Schema = db.Schema
		}
		if _, err := saga.NewCleaner(db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
}

// testSaga is a saga row the retention tests insert directly.
type testSaga struct {
	id       string
	status   saga.Status
	endedAge time.Duration // 0: no ended_at
	wasStuck bool          // a stuck event in its history
	history  int           // history rows
}

// insertSagas writes sagas and their history with one statement each.
func insertSagas(t testing.TB, db *pgtest.DB, sagas []testSaga) {
	t.Helper()
	ctx := context.Background()
	inst, hist := sqlident.Table(db.Schema, "saga_instance"), sqlident.Table(db.Schema, "saga_history")
	var ids, statuses, hids, hevents, hstatuses []string
	var ages []int64
	for _, s := range sagas {
		ids, statuses = append(ids, s.id), append(statuses, string(s.status))
		ages = append(ages, int64(s.endedAge/time.Second))
		for i := range s.history {
			ev, st := "command", "running"
			if i == 0 {
				ev = "started"
			}
			if s.wasStuck && i == s.history/2 {
				ev, st = "stuck", "stuck"
			}
			hids, hevents, hstatuses = append(hids, s.id), append(hevents, ev), append(hstatuses, st)
		}
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+inst+` (id, type, def_version, status, data, input, created_at, updated_at, ended_at)
SELECT id, 'order', 1, status, '{}', '{}', now() - interval '90 days', now(),
       CASE WHEN age = 0 THEN NULL ELSE now() - age * interval '1 second' END
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, status, age)`, ids, statuses, ages); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+hist+` (saga_id, at, event, status)
SELECT id, now(), event, status FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, event, status)`, hids, hevents, hstatuses); err != nil {
		t.Fatal(err)
	}
}

// rowDigests returns, per saga id, a digest of its row and its history.
func rowDigests(t testing.TB, db *pgtest.DB) map[string]string {
	t.Helper()
	inst, hist := sqlident.Table(db.Schema, "saga_instance"), sqlident.Table(db.Schema, "saga_history")
	rows, err := db.Pool.Query(context.Background(), `SELECT i.id, md5(row_to_json(i)::text) || ':' || coalesce(
       (SELECT md5(string_agg(row_to_json(h)::text, ',' ORDER BY h.id)) FROM `+hist+` h WHERE h.saga_id = i.id), '-')
  FROM `+inst+` i`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for rows.Next() {
		var id, d string
		if err := rows.Scan(&id, &d); err != nil {
			t.Fatal(err)
		}
		out[id] = d
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func orphanHistory(t testing.TB, db *pgtest.DB) int {
	t.Helper()
	inst, hist := sqlident.Table(db.Schema, "saga_instance"), sqlident.Table(db.Schema, "saga_history")
	var n int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+hist+` h
 WHERE NOT EXISTS (SELECT 1 FROM `+inst+` i WHERE i.id = h.saga_id)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// testSeed is SEED from the environment, to replay a run, or a new one.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with SEED=%d)", seed, seed)
	return seed
}

// Over random sagas in random statuses, ages and stuck episodes, with
// random windows and batch sizes, Clean removes exactly the ended sagas
// whose window has passed, with their history, and leaves every other
// saga and its history as it was: never a running, compensating, stuck,
// paused or scheduled one, whatever its ended_at.
func TestCleanerRemovesExactlyTheExpiredEndedSagas(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rnd := rand.New(rand.NewPCG(seed, seed^0x5eed))
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	day := 24 * time.Hour
	cfg := saga.CleanerConfig{
		Schema:           db.Schema,
		CompletedAfter:   time.Duration(1+rnd.IntN(20)) * day,
		CompensatedAfter: time.Duration(1+rnd.IntN(40)) * day,
		StuckAfter:       time.Duration(1+rnd.IntN(50)) * day,
		BatchSize:        7 + rnd.IntN(300),
	}
	t.Logf("config %+v", cfg)
	statuses := []saga.Status{saga.StatusRunning, saga.StatusCompensating, saga.StatusStuck, saga.StatusPaused, saga.StatusScheduled,
		saga.StatusCompleted, saga.StatusCompensated}
	sagas := make([]testSaga, 3000)
	want := map[string]bool{} // the ids Clean must remove
	for i := range sagas {
		s := testSaga{id: fmt.Sprintf("s-%04d", i), status: statuses[rnd.IntN(len(statuses))],
			wasStuck: rnd.IntN(4) == 0, history: 1 + rnd.IntN(4)}
		if rnd.IntN(10) != 0 { // mostly with an ended_at, live ones too: it must not matter for them
			s.endedAge = time.Duration(rnd.IntN(60))*day + 12*time.Hour // never on a window's edge
		}
		sagas[i] = s
		window := map[saga.Status]time.Duration{saga.StatusCompleted: cfg.CompletedAfter, saga.StatusCompensated: cfg.CompensatedAfter}[s.status]
		if window > 0 && s.endedAge > window && (!s.wasStuck || s.endedAge > cfg.StuckAfter) {
			want[s.id] = true
		}
	}
	insertSagas(t, db, sagas)
	before := rowDigests(t, db)

	c, err := saga.NewCleaner(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Clean(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if n != len(want) {
		t.Errorf("Clean removed %d sagas, want %d", n, len(want))
	}
	after := rowDigests(t, db)
	for _, s := range sagas {
		d, kept := after[s.id]
		switch {
		case want[s.id] && kept:
			t.Errorf("saga %+v was kept, want removed", s)
		case !want[s.id] && !kept:
			t.Errorf("saga %+v was removed, want kept", s)
		case kept && d != before[s.id]:
			t.Errorf("saga %+v or its history changed", s)
		}
	}
	if o := orphanHistory(t, db); o != 0 {
		t.Errorf("%d history rows of removed sagas left", o)
	}
	// A second pass finds nothing.
	if n, err := c.Clean(context.Background()); err != nil || n != 0 {
		t.Fatalf("second Clean: %d, %v; want 0", n, err)
	}
}

// Clean removes a backlog of old sagas in batches of at most BatchSize,
// each a short statement, while writers keep starting sagas, and keeps
// them all.
func TestCleanerKeepsItsRateUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOptions{})
	def := mustDefine(t, orderSpec(b, 1))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	const old, batch = 2000, 100
	sagas := make([]testSaga, old)
	for i := range sagas {
		sagas[i] = testSaga{id: fmt.Sprintf("old-%04d", i), status: saga.StatusCompleted, endedAge: 40 * 24 * time.Hour, history: 5}
	}
	insertSagas(t, b.db, sagas)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var started atomic.Int64
	var startErr atomic.Value
	var ids sync.Map
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("new-%d-%d", w, i)
				if _, err := saga.Start(context.Background(), b.o, def, id, order{ID: id, Amount: 1}); err != nil {
					startErr.Store(err)
					return
				}
				ids.Store(id, true)
				started.Add(1)
			}
		})
	}
	c, err := saga.NewCleaner(b.db.Pool, saga.CleanerConfig{Schema: b.db.Schema, BatchSize: batch})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	var slowest time.Duration
	saga.SetCleanerAfterBatch(c, func(n int, took time.Duration) {
		sizes = append(sizes, n)
		slowest = max(slowest, took)
	})
	deadline := time.Now().Add(10 * time.Second)
	for started.Load() < 10 && startErr.Load() == nil { // poll until the writers are under way
		if time.Now().After(deadline) {
			t.Fatal("the writers started no saga")
		}
		time.Sleep(time.Millisecond)
	}
	begin := time.Now()
	n, err := c.Clean(context.Background())
	took := time.Since(begin)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if e := startErr.Load(); e != nil {
		t.Fatalf("a writer failed: %v", e)
	}
	t.Logf("removed %d sagas in %d batches in %s (slowest batch %s) while %d sagas started", n, len(sizes), took, slowest, started.Load())
	if n != old {
		t.Fatalf("removed %d, want %d", n, old)
	}
	if slices.Max(sizes) > batch || len(sizes) < old/batch {
		t.Fatalf("batch sizes %v, want at most %d each", sizes, batch)
	}
	// Each batch is one short statement, even on a loaded machine.
	if slowest > 5*time.Second {
		t.Fatalf("slowest batch took %s", slowest)
	}
	after := rowDigests(t, b.db)
	kept := 0
	ids.Range(func(k, _ any) bool {
		if _, ok := after[k.(string)]; !ok {
			t.Errorf("saga %s started during the clean was removed", k)
		}
		kept++
		return true
	})
	if len(after) != kept {
		t.Fatalf("%d sagas left, want the %d started", len(after), kept)
	}
}

// The Cleaner removes bulk operations older than BulkAfter with their
// records, in batches, and keeps the recent ones whole.
func TestCleanerRemovesOldBulkOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefunds(t, db, "refund", 25)
	p, err := saga.NewOperator(db.Pool, saga.OperatorConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	by := saga.Actor{Operator: "alice", Reason: "retention test"}
	old, err := p.Plan(ctx, saga.ActionRetry, saga.Query{Type: "refund"}, by)
	if err != nil {
		t.Fatal(err)
	}
	recent, err := p.Plan(ctx, saga.ActionRetry, saga.Query{Type: "refund", Limit: 10}, by)
	if err != nil {
		t.Fatal(err)
	}
	ops, items := sqlident.Table(db.Schema, "saga_bulk_operation"), sqlident.Table(db.Schema, "saga_bulk_item")
	if _, err := db.Pool.Exec(ctx, `UPDATE `+ops+` SET created_at = now() - interval '40 days' WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	c, err := saga.NewCleaner(db.Pool, saga.CleanerConfig{Schema: db.Schema, BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Clean(ctx); err != nil {
		t.Fatal(err)
	}
	count := func(table, id string) int {
		var n int
		col := map[string]string{ops: "id", items: "operation_id"}[table]
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE `+col+` = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if count(ops, old.ID) != 0 || count(items, old.ID) != 0 {
		t.Fatalf("the 40-day-old operation left: %d operation, %d records", count(ops, old.ID), count(items, old.ID))
	}
	if count(ops, recent.ID) != 1 || count(items, recent.ID) != 10 {
		t.Fatalf("the recent operation: %d operation, %d records; want 1 and 10", count(ops, recent.ID), count(items, recent.ID))
	}
	if _, err := p.BulkStatus(ctx, old.ID); !errors.Is(err, saga.ErrBulkNotFound) {
		t.Fatalf("BulkStatus of the removed operation: %v, want ErrBulkNotFound", err)
	}
}
