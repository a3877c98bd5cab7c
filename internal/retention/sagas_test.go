package retention

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

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// testSaga is a saga row the tests insert directly.
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
	exec(t, db, `INSERT INTO {saga_instance} (id, type, def_version, status, data, input, created_at, updated_at, ended_at)
SELECT id, 'order', 1, status, '{}', '{}', now() - interval '90 days', now(),
       CASE WHEN age = 0 THEN NULL ELSE now() - age * interval '1 second' END
  FROM unnest($1::text[], $2::text[], $3::bigint[]) AS u(id, status, age)`, ids, statuses, ages)
	exec(t, db, `INSERT INTO {saga_history} (saga_id, at, event, status)
SELECT id, now(), event, status FROM unnest($1::text[], $2::text[], $3::text[]) AS u(id, event, status)`, hids, hevents, hstatuses)
}

// rowDigests returns, per saga id, a digest of its row and its history.
func rowDigests(t testing.TB, db *pgtest.DB) map[string]string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), tables(db, `SELECT i.id, md5(row_to_json(i)::text) || ':' || coalesce(
       (SELECT md5(string_agg(row_to_json(h)::text, ',' ORDER BY h.id)) FROM {saga_history} h WHERE h.saga_id = i.id), '-')
  FROM {saga_instance} i`))
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
	return count(t, db, `SELECT count(*) FROM {saga_history} h
 WHERE NOT EXISTS (SELECT 1 FROM {saga_instance} i WHERE i.id = h.saga_id)`)
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
// random windows and batch sizes, a pass removes exactly the ended sagas
// whose window has passed (for one ever stuck, the Compensated window
// too), with their history, and leaves every other saga and its history
// as it was: never a running, compensating, stuck, paused or scheduled
// one, whatever its ended_at.
func TestPassRemovesExactlyTheExpiredEndedSagas(t *testing.T) {
	t.Parallel()
	seed := testSeed(t)
	rnd := rand.New(rand.NewPCG(seed, seed^0x5eed))
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	day := 24 * time.Hour
	cfg := Config{
		Completed:   time.Duration(1+rnd.IntN(40)) * day,
		Compensated: time.Duration(1+rnd.IntN(50)) * day,
	}
	batch := batchSizes{sagas: 7 + rnd.IntN(300)}
	t.Logf("config %+v, batch %+v", cfg, batch)
	statuses := []saga.Status{saga.StatusRunning, saga.StatusCompensating, saga.StatusStuck, saga.StatusPaused, saga.StatusScheduled,
		saga.StatusCompleted, saga.StatusCompensated}
	sagas := make([]testSaga, 3000)
	want := map[string]bool{} // the ids the pass must remove
	for i := range sagas {
		s := testSaga{id: fmt.Sprintf("s-%04d", i), status: statuses[rnd.IntN(len(statuses))],
			wasStuck: rnd.IntN(4) == 0, history: 1 + rnd.IntN(4)}
		if rnd.IntN(10) != 0 { // mostly with an ended_at, live ones too: it must not matter for them
			s.endedAge = time.Duration(rnd.IntN(60))*day + 12*time.Hour // never on a window's edge
		}
		sagas[i] = s
		window := map[saga.Status]time.Duration{saga.StatusCompleted: cfg.Completed, saga.StatusCompensated: cfg.Compensated}[s.status]
		if window > 0 && s.endedAge > window && (!s.wasStuck || s.endedAge > cfg.Compensated) {
			want[s.id] = true
		}
	}
	insertSagas(t, db, sagas)
	before := rowDigests(t, db)

	c := newCleaner(t, db, cfg, batch)
	if r := pass(t, c); r != (Removed{Sagas: len(want)}) {
		t.Errorf("Pass removed %+v, want %d sagas", r, len(want))
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
	if r := pass(t, c); r != (Removed{}) {
		t.Fatalf("second Pass removed %+v; want nothing", r)
	}
}

// A pass removes a backlog of old sagas in batches of at most the batch
// size, each a short statement, while writers keep starting sagas, and
// keeps them all.
func TestPassKeepsItsRateUnderLoad(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 6})
	s := opstest.NewSagas(t, db)
	const old, batch = 2000, 100
	sagas := make([]testSaga, old)
	for i := range sagas {
		sagas[i] = testSaga{id: fmt.Sprintf("old-%04d", i), status: saga.StatusCompleted, endedAge: 40 * 24 * time.Hour, history: 5}
	}
	insertSagas(t, db, sagas)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var started atomic.Int64
	var startErr atomic.Value
	var ids sync.Map
	for w := range 2 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("new-%d-%d", w, i)
				if _, err := saga.Start(context.Background(), s.O, s.Ship, id, opstest.Order{ID: id}); err != nil {
					startErr.Store(err)
					return
				}
				ids.Store(id, true)
				started.Add(1)
			}
		})
	}
	c := newCleaner(t, db, Config{}, batchSizes{sagas: batch})
	var sizes []int
	var slowest time.Duration
	c.afterSagaBatch = func(n int, took time.Duration) {
		sizes = append(sizes, n)
		slowest = max(slowest, took)
	}
	waitFor(t, 10*time.Second, "the writers to start sagas", func() bool { return started.Load() >= 10 || startErr.Load() != nil })
	begin := time.Now()
	r, err := c.Pass(context.Background())
	took := time.Since(begin)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if e := startErr.Load(); e != nil {
		t.Fatalf("a writer failed: %v", e)
	}
	t.Logf("removed %d sagas in %d batches in %s (slowest batch %s) while %d sagas started", r.Sagas, len(sizes), took, slowest, started.Load())
	if r.Sagas != old {
		t.Fatalf("removed %d, want %d", r.Sagas, old)
	}
	if slices.Max(sizes) > batch || len(sizes) < old/batch {
		t.Fatalf("batch sizes %v, want at most %d each", sizes, batch)
	}
	// Each batch is one short statement, even on a loaded machine.
	if slowest > 5*time.Second {
		t.Fatalf("slowest batch took %s", slowest)
	}
	after := rowDigests(t, db)
	kept := 0
	ids.Range(func(k, _ any) bool {
		if _, ok := after[k.(string)]; !ok {
			t.Errorf("saga %s started during the pass was removed", k)
		}
		kept++
		return true
	})
	if len(after) != kept {
		t.Fatalf("%d sagas left, want the %d started", len(after), kept)
	}
}

// A pass removes bulk operations created before the Compensated window
// with their records, in batches, and keeps the younger ones whole.
func TestPassRemovesOldBulkOperations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefunds(t, db, "refund", 25)
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
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
	exec(t, db, `UPDATE {saga_bulk_operation} SET created_at = now() - interval '40 days' WHERE id = $1`, old.ID)
	// Past the Completed window, not past Compensated: kept.
	exec(t, db, `UPDATE {saga_bulk_operation} SET created_at = now() - interval '20 days' WHERE id = $1`, recent.ID)
	c := newCleaner(t, db, Config{}, batchSizes{sagas: 7})
	if r := pass(t, c); r != (Removed{Bulk: 1}) {
		t.Fatalf("Pass removed %+v, want 1 bulk operation", r)
	}
	ops := func(id string) int {
		return count(t, db, `SELECT count(*) FROM {saga_bulk_operation} WHERE id = $1`, id)
	}
	items := func(id string) int {
		return count(t, db, `SELECT count(*) FROM {saga_bulk_item} WHERE operation_id = $1`, id)
	}
	if ops(old.ID) != 0 || items(old.ID) != 0 {
		t.Fatalf("the 40-day-old operation left: %d operation, %d records", ops(old.ID), items(old.ID))
	}
	if ops(recent.ID) != 1 || items(recent.ID) != 10 {
		t.Fatalf("the 20-day-old operation: %d operation, %d records; want 1 and 10", ops(recent.ID), items(recent.ID))
	}
	if _, err := p.BulkStatus(ctx, old.ID); !errors.Is(err, saga.ErrBulkNotFound) {
		t.Fatalf("BulkStatus of the removed operation: %v, want ErrBulkNotFound", err)
	}
}

// A pass removes an ended saga's stored events with it, and keeps those
// of a saga it keeps.
func TestPassRemovesStoredEvents(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	insertSagas(t, db, []testSaga{
		{id: "old", status: saga.StatusCompleted, endedAge: 30 * 24 * time.Hour, history: 3},
		{id: "recent", status: saga.StatusCompleted, endedAge: time.Hour, history: 3},
	})
	exec(t, db, `INSERT INTO {saga_event} (saga_id, name, event_id, payload, state, step, at)
SELECT id, 'payment.confirmed', 'psp', '{"ref":"r"}', 'consumed', 'paid', now() - interval '30 days'
  FROM unnest(ARRAY['old', 'recent']) id`)
	if r := pass(t, newCleaner(t, db, Config{}, batchSizes{})); r != (Removed{Sagas: 1}) {
		t.Fatalf("Pass removed %+v, want 1 saga", r)
	}
	events := func(id string) int { return count(t, db, `SELECT count(*) FROM {saga_event} WHERE saga_id = $1`, id) }
	if n := events("old"); n != 0 {
		t.Fatalf("%d events of the removed saga left", n)
	}
	if n := events("recent"); n != 1 {
		t.Fatalf("the kept saga has %d events, want 1", n)
	}
}

// A pass removes an ended saga's keys and attributes with it; keeps a
// child saga, ended and past its window, while its parent is there (the
// parent may still compensate it), and removes it once the parent is
// gone; and removes the events sent by key that no saga held once they
// are Compensated old.
func TestPassRemovesAttributesAndKeepsChildrenOfLiveParents(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	old := 40 * 24 * time.Hour
	insertSagas(t, db, []testSaga{
		{id: "old", status: saga.StatusCompleted, endedAge: old, history: 2},
		{id: "parent", status: saga.StatusRunning, history: 2},
		{id: "child", status: saga.StatusCompleted, endedAge: old, history: 2},
		{id: "old-parent", status: saga.StatusCompleted, endedAge: time.Hour, history: 2},
		{id: "old-child", status: saga.StatusCompleted, endedAge: old, history: 2},
	})
	exec(t, db, `UPDATE {saga_instance} SET parent = 'parent' WHERE id = 'child'`)
	exec(t, db, `UPDATE {saga_instance} SET parent = 'old-parent' WHERE id = 'old-child'`)
	exec(t, db, `INSERT INTO {saga_attr} (saga_id, name, type, kind, value, live, created_at)
SELECT id, 'customer', 'order', 'text', 'ada', false, now() FROM unnest(ARRAY['old', 'child', 'parent']) id`)
	exec(t, db, `INSERT INTO {saga_event} (saga_id, name, event_id, state, at, key_type, key_name, key_value)
VALUES ('', 'paid', 'e-old', 'refused', now() - interval '40 days', 'order', 'payment_id', 'pi_1'),
       ('', 'paid', 'e-new', 'refused', now() - interval '1 day', 'order', 'payment_id', 'pi_2')`)
	if r := pass(t, newCleaner(t, db, Config{}, batchSizes{})); r != (Removed{Sagas: 1}) {
		t.Fatalf("Pass removed %+v, want 1 saga (old)", r)
	}
	attrs := func(id string) int { return count(t, db, `SELECT count(*) FROM {saga_attr} WHERE saga_id = $1`, id) }
	if n, m := attrs("old"), attrs("child"); n != 0 || m != 1 {
		t.Fatalf("attributes left: %d of the removed saga (want 0), %d of the kept child (want 1)", n, m)
	}
	for _, id := range []string{"child", "old-child"} {
		if count(t, db, `SELECT count(*) FROM {saga_instance} WHERE id = $1`, id) != 1 {
			t.Fatalf("child %s removed while its parent is there", id)
		}
	}
	if n := count(t, db, `SELECT count(*) FROM {saga_event} WHERE saga_id = ''`); n != 1 {
		t.Fatalf("%d events no saga held left, want 1 (the recent one)", n)
	}
	exec(t, db, `DELETE FROM {saga_instance} WHERE id = 'old-parent'`)
	if r := pass(t, newCleaner(t, db, Config{}, batchSizes{})); r != (Removed{Sagas: 1}) {
		t.Fatalf("second Pass removed %+v, want 1 saga (old-child, its parent gone)", r)
	}
}
