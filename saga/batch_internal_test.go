package saga

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// A batch's marks carry the lock of its sagas in their round trip: the
// marks' rows come back as they are, the sagas are locked and read when
// those rows close, and a failed mark leaves the lock unrun.
func TestMarkThenLockLocksInTheMarksRoundTrip(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 4})
	ctx := context.Background()
	sql := newStatements(db.Schema)
	inst := sqlident.Table(db.Schema, "saga_instance")
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+inst+` (id, type, def_version, status, data, input, created_at, updated_at)
SELECT id, 'order', 1, 'running', '{}', '{}', now(), now() FROM unnest(ARRAY['b', 'a', 'c']) id`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	var round int
	mt := &markThenLock{Tx: &countingTx{Tx: tx, rounds: &round}, lock: sql.lockMany, ids: []string{"b", "a", "missing"}}
	rows, err := mt.Query(ctx, `SELECT n FROM generate_series(1, 3) n`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil || len(got) != 3 || got[2] != 3 {
		t.Fatalf("the marks' rows: %v, %v; want 1,2,3", got, err)
	}
	if !mt.sent || mt.err != nil || len(mt.locked) != 2 || mt.locked[0].ID != "a" || mt.locked[1].ID != "b" {
		t.Fatalf("sent %v, err %v, %d locked; want a and b, in id order", mt.sent, mt.err, len(mt.locked))
	}
	if round != 1 {
		t.Fatalf("%d round trips; want the marks and the lock in one", round)
	}
	// The rows are locked for tx: another transaction cannot take them.
	other, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	var free string
	if err := other.QueryRow(ctx, `SELECT id FROM `+inst+` WHERE id = 'c' FOR UPDATE NOWAIT`).Scan(&free); err != nil {
		t.Fatalf("saga c, not in the batch, is locked too: %v", err)
	}
	var pgErr *pgconn.PgError
	if _, err := other.Exec(ctx, `SELECT id FROM `+inst+` WHERE id = 'a' FOR UPDATE NOWAIT`); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("another transaction took saga a: %v; want lock_not_available", err)
	}

	// A later Query is the transaction's own.
	var one int
	rows, err = mt.Query(ctx, `SELECT 1`)
	if err == nil {
		one, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int])
	}
	if err != nil || one != 1 {
		t.Fatalf("a later query: %d, %v", one, err)
	}

	// A mark that fails: the error is the caller's, and the lock did not run.
	sp, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad := &markThenLock{Tx: sp, lock: sql.lockMany, ids: []string{"c"}}
	rows, err = bad.Query(ctx, `SELECT 1/0`)
	if err == nil {
		_, err = pgx.CollectRows(rows, pgx.RowTo[int])
	}
	if err == nil || bad.err == nil || bad.locked != nil {
		t.Fatalf("failing mark: %v, lock err %v, %d locked; want both errors, nothing locked", err, bad.err, len(bad.locked))
	}
}

// countingTx counts the round trips that send statements.
type countingTx struct {
	pgx.Tx
	rounds *int
}

func (t *countingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	*t.rounds++
	return t.Tx.SendBatch(ctx, b)
}

func (t *countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	*t.rounds++
	return t.Tx.Query(ctx, sql, args...)
}

func (t *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	*t.rounds++
	return t.Tx.Exec(ctx, sql, args...)
}

// The batch save fails as a statement when it saves fewer sagas than it
// was given: its check must stop the COMMIT that pipeline.BeginFunc sends
// behind it in the same round trip, which a check of its row count after
// the fact could not.
func TestUpdateManyFailsWhenItSavesFewer(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	ctx := context.Background()
	sql := newStatements(db.Schema)
	inst := sqlident.Table(db.Schema, "saga_instance")
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+inst+` (id, type, def_version, status, data, input, created_at, updated_at)
VALUES ('a', 'order', 1, 'running', '{}', '{}', now(), now())`); err != nil {
		t.Fatal(err)
	}
	save := func(ids ...string) error {
		n := len(ids)
		texts := func(v string) []string { return slices.Repeat([]string{v}, n) }
		times := func() []*time.Time { return make([]*time.Time, n) }
		now := slices.Repeat([]time.Time{time.Now()}, n)
		_, err := db.Pool.Exec(ctx, sql.updateMany, ids, texts("completed"), texts("forward"), texts(""), texts("{}"), texts("{}"),
			times(), times(), make([]int32, n), texts(""), now, times(), n)
		return err
	}
	if err := save("a"); err != nil {
		t.Fatalf("saving the one saga there is: %v", err)
	}
	var status string
	if err := db.Pool.QueryRow(ctx, `SELECT status FROM `+inst+` WHERE id = 'a'`).Scan(&status); err != nil || status != "completed" {
		t.Fatalf("saved status %q, %v; want completed", status, err)
	}
	if err := save("a", "missing"); err == nil || !strings.Contains(err.Error(), "saved 1 of 2 sagas") {
		t.Fatalf("saving a saga that is not there: %v; want the statement to fail, saying saved 1 of 2", err)
	}
	// The failed statement wrote nothing: no row for the missing saga (the
	// upsert's insert path), and the saga there kept its first save.
	var missing bool
	var version int64
	if err := db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+inst+` WHERE id = 'missing'), (SELECT version FROM `+inst+` WHERE id = 'a')`).Scan(&missing, &version); err != nil {
		t.Fatal(err)
	}
	if missing || version != 2 {
		t.Fatalf("after the failed save: row for the missing saga %v, version of a %d; want none and 2", missing, version)
	}
}

// The batch save's plan is the same whatever the tables hold: lookups in
// saga_instance's primary key, never a join the planner could make a hash
// of the whole table. A plan PostgreSQL keeps for a prepared statement is
// made once, on the tables as they are then (here: new and empty), and
// kept while they grow.
func TestUpdateManyPlanHasNoJoin(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 1})
	db.CheckUpsertPlan(t, newStatements(db.Schema).updateMany, 13, "saga_instance_pkey")
}

// The lock of a batch's sagas keeps one plan, a scan of the primary key:
// PostgreSQL does not plan it again for each batch's ids (the lock with
// "id = ANY($1)" was planned at every execution, a plan for two ids
// looking cheaper than one for an array of unknown length). A plan kept
// while the table was empty (a sequential scan, the cheapest there) is
// made again when the table is analyzed, as autovacuum does once rows
// come; PostgreSQL plans for the arguments for a while (its average cost
// of those plans still counts the cheap ones on the empty table), then
// keeps the generic plan again.
func TestLockManyKeepsItsGenericPlan(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	ctx := context.Background()
	sql := newStatements(db.Schema)
	inst := sqlident.Table(db.Schema, "saga_instance")
	lock := db.Prepare(t, sql.lockMany)
	ids := []string{"s7", "s3"}
	// Five plans for the arguments, then the generic plan.
	if generic := lock.Execute(10, ids); generic != 5 {
		t.Fatalf("generic plans in 10 executions = %d, want 5", generic)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+inst+` (id, type, def_version, status, data, input, created_at, updated_at)
SELECT 's' || g, 'order', 1, 'running', '{}', '{}', now(), now() FROM generate_series(1, 5000) g`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `ANALYZE `+inst); err != nil {
		t.Fatal(err)
	}
	before := lock.Execute(100, ids)
	if after := lock.Execute(10, ids); after-before != 10 {
		t.Fatalf("generic plans in the last 10 of 110 executions = %d, want 10", after-before)
	}
	plan := lock.Explain(`'{s7,s3}'`)
	if !strings.Contains(plan, "saga_instance_pkey") || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "Join") {
		t.Fatalf("plan after ANALYZE:\n%s\nwant a scan of saga_instance_pkey, with no join and no sequential scan", plan)
	}
}
