package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// runRelay starts r.Run(ctx) and returns a channel that receives its result.
func runRelay(ctx context.Context, r *outbox.Relay) <-chan error {
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done
}

// A relay whose workers wait for a connection of an exhausted pool returns
// promptly when its context ends: acquire, begin, lane locks and claim use
// the Run context; only a claimed batch outlives it.
func TestRelayStopsPromptlyWhilePoolIsExhausted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	w := newWriter(t, db)
	rec := &recorder{}
	r, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: rec, PollOnly: true,
		PollInterval: 5 * time.Millisecond, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := runRelay(rctx, r)
	ids := writeN(t, w, "t", 10, 3)
	eventually(t, 20*time.Second, "relay running", func() bool { return len(rec.ids()) == len(ids) })

	// The caller takes every connection of the pool.
	var held []*pgxpool.Conn
	for range db.Pool.Config().MaxConns {
		c, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	// The pool counts waiting acquires only once they end, so give the
	// workers (polling every 5ms) time to queue for a connection, and check
	// after the stop that they did: their acquires were cancelled.
	cancelled := db.Pool.Stat().CanceledAcquireCount()
	time.Sleep(200 * time.Millisecond)

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of cancel while the pool was exhausted")
	}
	if db.Pool.Stat().CanceledAcquireCount() == cancelled {
		t.Fatal("no worker was waiting for a connection: the test did not exhaust the pool")
	}
}

// Run returns an error at start when the outbox tables are missing.
func TestRelayRunFailsWithoutSchema(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 2})
	r, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: &recorder{}, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	select {
	case err := <-runRelay(ctx, r):
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
			t.Fatalf("Run on a schema without tables = %v, want an error wrapping 42P01 undefined_table", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept going on a schema without tables")
	}
}

// Run returns an error at start when the role lacks a privilege the relay
// needs, and runs when it has them all.
func TestRelayRunChecksPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	role := pgtest.RandomName("relay_role")
	schema := sqlident.Quote(db.Schema)
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA ` + schema + ` TO ` + role,
		`GRANT SELECT ON ALL TABLES IN SCHEMA ` + schema + ` TO ` + role,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// After the role's pool is closed (cleanups run last in, first out).
		for _, q := range []string{`DROP OWNED BY ` + role, `DROP ROLE ` + role} {
			if _, err := db.Pool.Exec(context.Background(), q); err != nil {
				t.Logf("%s: %v", q, err)
			}
		}
	})
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User = role
	cfg.MaxConns = 3
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rec := &recorder{}
	newRelay := func() *outbox.Relay {
		r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: db.Schema, Publisher: rec, PollInterval: 10 * time.Millisecond, Logger: watermill.NopLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	select {
	case err := <-runRelay(rctx, newRelay()):
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("Run with SELECT only = %v, want an error wrapping 42501 insufficient_privilege", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run kept going without the privileges it needs")
	}

	if _, err := db.Pool.Exec(ctx, `GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA `+schema+` TO `+role); err != nil {
		t.Fatal(err)
	}
	rctx2, cancel2 := context.WithCancel(ctx)
	done := runRelay(rctx2, newRelay())
	ids := writeN(t, w, "t", 20, 4)
	eventually(t, 20*time.Second, "events published by the granted role", func() bool { return len(rec.ids()) == len(ids) })
	cancel2()
	if err := <-done; err != nil {
		t.Fatalf("Run with every privilege = %v", err)
	}
}
