package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
)

// env is what the demo runs on: a PostgreSQL schema of its own with
// millrace's tables and the services' tables, and a Kafka cluster.
type env struct {
	pool   *pgxpool.Pool
	schema string
	admin  *outbox.Admin // the outbox's operator API: backlog stats, replay

	brokers       []string
	embedded      *devbroker.Broker // nil when KAFKA_BROKERS named a cluster
	ordersTopic   string
	invoicesTopic string
	billingGroup  string // billing's Kafka consumer group

	logger watermill.LoggerAdapter // for Watermill and millrace components
}

// The services' own tables. In production the orders and billing services
// would each have a database of their own, each with millrace's tables for
// its outbox (and billing's processed_event); the demo keeps both in one
// schema to stay one program.
const businessSchema = `
-- orders service
CREATE TABLE customer (
    id            text    PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0 -- numbers each customer's orders 1, 2, 3, ...
);
CREATE TABLE orders (
    id           bigint      PRIMARY KEY,
    customer_id  text        NOT NULL REFERENCES customer,
    customer_seq integer     NOT NULL, -- the customer's n-th order
    amount_cents bigint      NOT NULL,
    placed_at    timestamptz NOT NULL DEFAULT now()
);

-- billing service
CREATE TABLE customer_balance (
    customer_id   text    PRIMARY KEY,
    balance_cents bigint  NOT NULL DEFAULT 0,
    orders_billed integer NOT NULL DEFAULT 0
);`

func setUp(ctx context.Context, cfg config) (_ *env, err error) {
	suffix := randomHex(4)
	e := &env{
		schema:        "millrace_demo_" + suffix,
		ordersTopic:   "demo.orders." + suffix,
		invoicesTopic: "demo.invoices." + suffix,
		billingGroup:  "demo.billing." + suffix,
		// Warnings and errors of Watermill, sarama and the relays go to the
		// progress log; their info-level chatter does not.
		logger: watermill.NewSlogLogger(slog.New(slog.NewTextHandler(cfg.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	}
	defer func() {
		if err != nil {
			e.tearDown(config{Log: cfg.Log}, func(string, ...any) {})
		}
	}()

	if e.pool, err = connect(ctx, cfg.DatabaseURL, e.schema); err != nil {
		return e, err
	}
	// millrace's tables: the outbox (migration 001) and the inbox (002).
	m, err := migrations.New(e.pool, migrations.Config{Schema: e.schema})
	if err != nil {
		return e, err
	}
	if _, err := m.Up(ctx); err != nil {
		return e, fmt.Errorf("migrate schema %s: %w", e.schema, err)
	}
	if err := createBusinessTables(ctx, e.pool, cfg.Customers); err != nil {
		return e, err
	}
	if e.admin, err = outbox.NewAdmin(e.pool, outbox.AdminConfig{Schema: e.schema}); err != nil {
		return e, err
	}

	// Kafka: the cluster in KAFKA_BROKERS, or an embedded broker speaking
	// the Kafka protocol on a free port (franz-go's kfake, 8 partitions per
	// topic, topics created on first use).
	e.brokers = cfg.Brokers
	if len(e.brokers) == 0 {
		if e.embedded, err = devbroker.Start(devbroker.Config{}); err != nil {
			return e, err
		}
		e.brokers = e.embedded.Addrs()
	}
	return e, nil
}

// connect opens a connection pool whose connections find unqualified table
// names in the demo's schema, so the services' SQL below reads plainly.
// millrace's own components are given the schema in their Config.
func connect(ctx context.Context, url, schema string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pc.MaxConns = 20 // order writers, two relays, billing's handlers, progress
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s:%d (database %q) does not answer: %w; run scripts/pg-up.sh or set DATABASE_URL",
			pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database, err)
	}
	return pool, nil
}

func createBusinessTables(ctx context.Context, pool *pgxpool.Pool, customers int) error {
	if _, err := pool.Exec(ctx, businessSchema); err != nil {
		return fmt.Errorf("create the services' tables: %w", err)
	}
	ids := make([]string, customers)
	for i := range ids {
		ids[i] = customerID(i + 1)
	}
	// Every customer starts with a zero balance at billing.
	_, err := pool.Exec(ctx, `
WITH c AS (INSERT INTO customer (id) SELECT unnest($1::text[]) RETURNING id)
INSERT INTO customer_balance (customer_id) SELECT id FROM c`, ids)
	if err != nil {
		return fmt.Errorf("create customers: %w", err)
	}
	return nil
}

func customerID(n int) string { return fmt.Sprintf("customer-%03d", n) }

// tearDown closes the broker and the pool and drops the schema, unless
// cfg.Keep asks to keep it. It runs after every component has stopped.
func (e *env) tearDown(cfg config, say func(string, ...any)) {
	if e.embedded != nil {
		e.embedded.Close()
	}
	if e.pool == nil {
		return
	}
	defer e.pool.Close()
	if cfg.Keep {
		say("kept schema %s; look inside with: psql \"$DATABASE_URL\" -c 'SET search_path = %s' -c 'TABLE customer_balance'", e.schema, e.schema)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{e.schema}.Sanitize()+` CASCADE`); err != nil {
		say("could not drop schema %s: %v", e.schema, err)
	}
}

func (e *env) brokerList() string { return strings.Join(e.brokers, ",") }

func (e *env) kafkaKind() string {
	if e.embedded != nil {
		return "embedded broker"
	}
	return "KAFKA_BROKERS"
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
