package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
	db, tbl := logTable(t)
	ctx := context.Background()
	trips := &pgtest.RoundTrips{}
	// One connection: one left in a transaction would be the next call's.
	pool, err := pgtest.ConnectTraced(ctx, pgtest.URL(), 1, trips)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
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
	err = BeginFunc(ctx, pool, func(tx *Tx) error {
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
	if got := trips.N() - before; got != 3 {
		t.Errorf("%d round trips; want 3: BEGIN, the first insert, then the queued ones with COMMIT", got)
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
