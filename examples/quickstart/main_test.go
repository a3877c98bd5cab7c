package main

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/saga"
)

// TestQuickstart runs the quickstart's main logic on a schema of its own
// and checks the saga completed and its effects were applied once.
func TestQuickstart(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	b, err := devbroker.Start(devbroker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	schema := fmt.Sprintf("quickstart_%d", time.Now().UnixNano())
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	// The schema is dropped, then the pool closed, after the test (a
	// deferred Close would run first, and the drop fail unseen).
	t.Cleanup(func() {
		defer pool.Close()
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})

	in, err := run(ctx, url, b.Addrs(), schema)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompleted {
		t.Fatalf("saga %s is %s (%s), want completed", in.ID, in.Status, in.LastError)
	}
	var status string
	var available int64
	var onHand int
	q := func(sql string, dst any) {
		t.Helper()
		if err := pool.QueryRow(ctx, sql).Scan(dst); err != nil {
			t.Fatal(err)
		}
	}
	q(`SELECT status FROM `+pgx.Identifier{schema, "orders"}.Sanitize(), &status)
	q(`SELECT available FROM `+pgx.Identifier{schema, "account"}.Sanitize(), &available)
	q(`SELECT on_hand FROM `+pgx.Identifier{schema, "stock"}.Sanitize(), &onHand)
	if status != "approved" || available != 70 || onHand != 9 {
		t.Fatalf("order %s, credit %d, stock %d; want approved, 70, 9", status, available, onHand)
	}
}
