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
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	tbl := sqlident.Table(db.Schema, "log")
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+sqlident.Quote(db.Schema)+`; CREATE TABLE `+tbl+` (n int)`); err != nil {
		t.Fatal(err)
	}
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
