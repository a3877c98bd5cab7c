package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// Whatever call comes next on a Tx, the queued
// statements run first, once, and in order.
func TestPipelineTxRunsQueuedStatementsFirst(t *testing.T) {
	t.Parallel()
	db, tbl := logTable(t)
	ctx := context.Background()
	queue := func() []Statement {
		return []Statement{{SQL: `INSERT INTO ` + tbl + ` VALUES ($1)`, Args: []any{1}}, {SQL: `INSERT INTO ` + tbl + ` SELECT count(*) + 1 FROM ` + tbl}}
	}
	const check = `SELECT string_agg(n::text, ',' ORDER BY n) FROM `
	for name, call := range map[string]func(ctx context.Context, tx pgx.Tx) (string, error){
		"Exec": func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+tbl+` SELECT count(*) + 1 FROM `+tbl)
			return "1,2,3", err
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) (string, error) {
			var s string
			err := tx.QueryRow(ctx, check+tbl).Scan(&s)
			return s, err
		},
		"Query": func(ctx context.Context, tx pgx.Tx) (string, error) {
			rows, err := tx.Query(ctx, check+tbl)
			if err != nil {
				return "", err
			}
			return pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) (string, error) {
			var s string
			br := tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{{SQL: check + tbl}}})
			err := br.QueryRow().Scan(&s)
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return s, err
		},
		"Begin": func(ctx context.Context, tx pgx.Tx) (string, error) {
			sub, err := tx.Begin(ctx)
			if err != nil {
				return "", err
			}
			var s string
			err = sub.QueryRow(ctx, check+tbl).Scan(&s)
			return s, err
		},
	} {
		t.Run(name, func(t *testing.T) {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			ptx := &Tx{Tx: tx, Before: queue()}
			got, err := call(ctx, ptx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ptx.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			var all string
			if err := tx.QueryRow(ctx, check+tbl).Scan(&all); err != nil {
				t.Fatal(err)
			}
			if name == "Exec" {
				got = "1,2,3"
				if all != got {
					t.Fatalf("table %s, want 1,2,3", all)
				}
			} else if got != "1,2" || all != "1,2" {
				t.Fatalf("%s saw %q, table %q; want the queued statements run first, once: 1,2", name, got, all)
			}
		})
	}
}

// A queued statement's Read sees its result, and an error it returns
// fails the call that sent it, as it is; without a Read, the statement's
// own error fails the call, naming the statement.
func TestTxReadsQueuedResults(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	var got int
	ptx := &Tx{Tx: tx, Before: []Statement{{SQL: `SELECT $1::int + 1`, Args: []any{41}, Read: func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(&got)
	}}}}
	if _, err := ptx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if got != 42 || len(ptx.Before) != 0 {
		t.Fatalf("Read saw %d, %d statements still queued; want 42, none", got, len(ptx.Before))
	}

	bad := errors.New("not what was wanted")
	for name, call := range map[string]func(*Tx) error{
		"Exec":      func(ptx *Tx) error { _, err := ptx.Exec(ctx, `SELECT 1`); return err },
		"Flush":     func(ptx *Tx) error { return ptx.Flush(ctx) },
		"SendBatch": func(ptx *Tx) error { return ptx.SendBatch(ctx, &pgx.Batch{}).Close() },
	} {
		sp, err := tx.Begin(ctx) // a savepoint: each case leaves tx usable
		if err != nil {
			t.Fatal(err)
		}
		ptx := &Tx{Tx: sp, Before: []Statement{{SQL: `SELECT 1`, Read: func(br pgx.BatchResults) error {
			_, _ = br.Exec()
			return bad
		}}}}
		if err := call(ptx); err != bad {
			t.Errorf("%s with a failing Read: %v, want its error as it is", name, err)
		}
		_ = sp.Rollback(ctx)

		sp, err = tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ptx = &Tx{Tx: sp, Before: []Statement{{SQL: "SELECT 1/0\n-- the rest", Args: nil}}}
		if err := call(ptx); err == nil || !strings.Contains(err.Error(), "SELECT 1/0: ") || strings.Contains(err.Error(), "the rest") {
			t.Errorf("%s with a failing statement: %v, want its error after its first line", name, err)
		}
		_ = sp.Rollback(ctx)
	}
}

// BeginFunc sends what is left queued, a Deferred Exec's statement
// included, with its COMMIT in one round trip; a failure anywhere rolls the
// whole transaction back, and the connection goes back to the pool out of
// any transaction either way.
func TestBeginFuncCommitsWithQueuedStatements(t *testing.T) {
	t.Parallel()
	db, tbl, pool, trips := tracedLog(t)
	ctx := context.Background()
	insert := `INSERT INTO ` + tbl + ` VALUES ($1)`
	rows := func() string {
		t.Helper()
		var s *string
		if err := db.Pool.QueryRow(ctx, `SELECT string_agg(n::text, ',' ORDER BY n) FROM `+tbl).Scan(&s); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, `TRUNCATE `+tbl); err != nil {
			t.Fatal(err)
		}
		if s == nil {
			return ""
		}
		return *s
	}
	idle := func(what string) {
		t.Helper()
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		if st := c.Conn().PgConn().TxStatus(); st != 'I' {
			t.Fatalf("%s: the pool's connection is in transaction status %q; want idle", what, st)
		}
	}
	if err := BeginFunc(ctx, pool, func(*Tx) error { return nil }); err != nil { // nothing queued: a plain commit
		t.Fatal(err)
	}
	idle("after a commit with nothing queued")

	before := trips.N()
	var committing bool
	err := BeginFunc(ctx, pool, func(tx *Tx) error {
		_, committing = Committing(tx)
		if _, err := tx.Exec(ctx, insert, 1); err != nil { // sent at once: nothing queued
			return err
		}
		tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{2}})
		_, err := tx.Deferred("write three").Exec(ctx, insert, 3)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := trips.N() - before; got != 2 {
		t.Errorf("%d round trips; want 2: BEGIN with the first insert, then the queued ones with COMMIT", got)
	}
	if got := rows(); got != "1,2,3" {
		t.Errorf("committed rows %q; want 1,2,3", got)
	}
	if !committing {
		t.Error("Committing is false for BeginFunc's Tx")
	}
	if _, ok := Committing(&Tx{}); ok {
		t.Error("Committing is true for a Tx that BeginFunc did not begin")
	}
	idle("after a commit with queued statements")

	// A queued statement that fails: nothing after it runs, COMMIT
	// included; the Deferred statement's error carries what it wrote.
	err = BeginFunc(ctx, pool, func(tx *Tx) error {
		tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{1}})
		_, err := tx.Deferred("write the broken one").Exec(ctx, `INSERT INTO `+tbl+` SELECT 1/0`)
		tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{3}})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "write the broken one: ") || !strings.Contains(err.Error(), "division by zero") {
		t.Errorf("failing queued statement: %v; want its error, wrapped", err)
	}
	if got := rows(); got != "" {
		t.Errorf("rows %q after a failed queued statement; want none", got)
	}
	idle("after a failed queued statement")

	// f failing, or panicking: rolled back, queued statements unsent.
	bad := errors.New("refused")
	err = BeginFunc(ctx, pool, func(tx *Tx) error {
		if _, err := tx.Exec(ctx, insert, 1); err != nil {
			return err
		}
		tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{2}})
		return bad
	})
	if err != bad {
		t.Errorf("f's error: got %v", err)
	}
	func() {
		defer func() { _ = recover() }()
		_ = BeginFunc(ctx, pool, func(tx *Tx) error {
			if _, err := tx.Exec(ctx, insert, 1); err != nil {
				return err
			}
			panic("boom")
		})
	}()
	if got := rows(); got != "" {
		t.Errorf("rows %q after f failed and panicked; want none", got)
	}
	idle("after f failed")

	// A failing COMMIT (a deferred constraint): the error says so, nothing
	// stays.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE `+tbl+` ADD CONSTRAINT once UNIQUE (n) DEFERRABLE INITIALLY DEFERRED`); err != nil {
		t.Fatal(err)
	}
	err = BeginFunc(ctx, pool, func(tx *Tx) error {
		tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{1}}, Statement{SQL: insert, Args: []any{1}})
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "commit: ") {
		t.Errorf("commit breaking a deferred constraint: %v; want the commit's error", err)
	}
	if got := rows(); got != "" {
		t.Errorf("rows %q after a failed commit; want none", got)
	}
	idle("after a failed commit")
}

// BeginFunc's BEGIN goes in the round trip of the transaction's first
// statement, whichever call sends it; a transaction that sends nothing
// sends no BEGIN; and what runs is a transaction all the same: another
// connection does not see it until COMMIT, and a rollback takes back
// everything, a statement run on the connection itself included.
func TestBeginFuncSendsBeginWithTheFirstStatement(t *testing.T) {
	t.Parallel()
	db, tbl, pool, trips := tracedLog(t)
	ctx := context.Background()
	insert := `INSERT INTO ` + tbl + ` VALUES ($1)`
	count := func() int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rollback := errors.New("roll back")
	// Warm the connection's statement cache, so that only the
	// transactions' own round trips are counted.
	for range 2 {
		_ = BeginFunc(ctx, pool, func(tx *Tx) error {
			_, _ = tx.Exec(ctx, insert, 0)
			var n int
			_ = tx.QueryRow(ctx, `SELECT count(*) FROM `+tbl).Scan(&n)
			_ = tx.QueryRow(ctx, `SELECT n FROM `+tbl+` WHERE n < 0`).Scan(&n)
			return rollback
		})
	}

	for _, c := range []struct {
		name  string
		f     func(tx *Tx) error
		trips int64 // BEGIN included, COMMIT or ROLLBACK included
		rows  int   // committed
	}{
		{"nothing sent", func(*Tx) error { return nil }, 0, 0},
		{"failing before sending", func(*Tx) error { return rollback }, 0, 0},
		{"Exec then commit", func(tx *Tx) error { _, err := tx.Exec(ctx, insert, 1); return err }, 2, 1},
		{"Exec then rollback", func(tx *Tx) error {
			if _, err := tx.Exec(ctx, insert, 1); err != nil {
				return err
			}
			if n := count(); n != 0 {
				t.Errorf("another connection sees %d rows of an uncommitted transaction", n)
			}
			return rollback
		}, 2, 0},
		{"QueryRow first", func(tx *Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `WITH i AS (`+insert+` RETURNING n) SELECT count(*) FROM i`, 1).Scan(&n); err != nil || n != 1 {
				return fmt.Errorf("QueryRow: %d, %v", n, err)
			}
			return nil
		}, 2, 1},
		{"QueryRow with no row", func(tx *Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT n FROM `+tbl+` WHERE n < 0`).Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("QueryRow of no row: %v; want pgx.ErrNoRows", err)
			}
			_, err := tx.Exec(ctx, insert, 1)
			return err
		}, 3, 1},
		{"Query first, with a queued statement", func(tx *Tx) error {
			tx.Before = append(tx.Before, Statement{SQL: insert, Args: []any{1}})
			rows, err := tx.Query(ctx, `SELECT n FROM `+tbl)
			if err != nil {
				return err
			}
			ns, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil || len(ns) != 1 || ns[0] != 1 {
				return fmt.Errorf("Query after a queued insert: %v, %v; want [1]", ns, err)
			}
			return nil
		}, 2, 1},
		{"the connection itself", func(tx *Tx) error {
			_, err := tx.Conn().Exec(ctx, insert, 1)
			if err == nil && count() != 0 {
				t.Error("a statement on tx.Conn() ran outside the transaction")
			}
			return rollback
		}, 3, 0},
		{"large objects", func(tx *Tx) error {
			lo := tx.LargeObjects()
			oid, err := lo.Create(ctx, 0)
			if err != nil {
				return err
			}
			if err := lo.Unlink(ctx, oid); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, insert, 1)
			return err
		}, 6, 1},
		{"a nested transaction rolled back", func(tx *Tx) error {
			if _, err := tx.Exec(ctx, insert, 1); err != nil {
				return err
			}
			sub, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sub.Exec(ctx, insert, 2); err != nil {
				return err
			}
			return sub.Rollback(ctx)
		}, 6, 1},
	} {
		before := trips.N()
		err := BeginFunc(ctx, pool, c.f)
		if err != nil && err != rollback {
			t.Errorf("%s: %v", c.name, err)
		}
		if got := trips.N() - before; got != c.trips {
			t.Errorf("%s: %d round trips; want %d", c.name, got, c.trips)
		}
		if got := count(); got != c.rows {
			t.Errorf("%s: %d rows committed; want %d", c.name, got, c.rows)
		}
		if _, err := db.Pool.Exec(ctx, `TRUNCATE `+tbl); err != nil {
			t.Fatal(err)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
			t.Errorf("%s: the connection went back in transaction status %q", c.name, st)
		}
		conn.Release()
	}
}

// tracedLog is logTable with a pool of one connection (one left in a
// transaction would be the next call's) whose round trips are counted.
func tracedLog(t *testing.T) (*pgtest.DB, string, *pgxpool.Pool, *pgtest.RoundTrips) {
	t.Helper()
	db, tbl := logTable(t)
	trips := &pgtest.RoundTrips{}
	pool, err := pgtest.ConnectTraced(context.Background(), pgtest.URL(), 1, trips)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return db, tbl, pool, trips
}

// logTable is a fresh schema holding one table of ints, its name quoted.
func logTable(t *testing.T) (*pgtest.DB, string) {
	t.Helper()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	tbl := sqlident.Table(db.Schema, "log")
	if _, err := db.Pool.Exec(context.Background(), `CREATE SCHEMA `+sqlident.Quote(db.Schema)+`; CREATE TABLE `+tbl+` (n int)`); err != nil {
		t.Fatal(err)
	}
	return db, tbl
}
