package compensation

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// Whatever call the outbox Writer makes on a pipelineTx, the queued
// statements run first, once, and in order.
func TestPipelineTxRunsQueuedStatementsFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2, NoMigrate: true})
	ctx := context.Background()
	tbl := sqlident.Table(db.Schema, "log")
	if _, err := db.Pool.Exec(ctx, `CREATE SCHEMA `+sqlident.Quote(db.Schema)+`; CREATE TABLE `+tbl+` (n int)`); err != nil {
		t.Fatal(err)
	}
	queue := func() []queued {
		return []queued{{sql: `INSERT INTO ` + tbl + ` VALUES ($1)`, args: []any{1}}, {sql: `INSERT INTO ` + tbl + ` SELECT count(*) + 1 FROM ` + tbl}}
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
			ptx := &pipelineTx{Tx: tx, before: queue()}
			got, err := call(ctx, ptx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ptx.flush(ctx); err != nil {
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
