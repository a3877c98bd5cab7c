// Command outbox is millrace's main example, the one `make demo` runs. It
// tells one story end to end, on PostgreSQL and the Kafka protocol:
//
//  1. An orders service places orders from a few goroutines. Each order is
//     one PostgreSQL transaction that inserts the order and writes an
//     OrderPlaced event to the outbox (outbox.Writer.WriteTx), keyed by
//     customer. Every 50th order fails validation and rolls back: its event
//     goes with it.
//  2. Two relays (outbox.Relay with kafka.Publisher) ship the events to
//     Kafka. Halfway through, relay-a stops, as if its pod were rescheduled;
//     relay-b takes over its lanes.
//  3. A billing service consumes OrderPlaced with a Watermill Router and
//     watermill-kafka's Subscriber. The inbox's dedup middleware runs each
//     event in a transaction that adds the amount to the customer's balance,
//     writes an InvoiceIssued event to the outbox, and records the event id
//     in processed_event: all or nothing, once per event.
//  4. An operator replays one customer's OrderPlaced events
//     (outbox.Admin.Replay). Kafka delivers them again; billing skips every
//     one and the balance does not move.
//  5. A summary, and the checks: every committed order billed exactly once,
//     no rolled-back order billed, each customer's orders seen in order.
//     The exit status is 1 when a check fails.
//
// Run it with
//
//	make demo                              # finds or starts PostgreSQL first
//	go run ./examples/outbox -orders 20000 # with DATABASE_URL set
//
// DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test.
// KAFKA_BROKERS (comma-separated host:port) selects a real Kafka cluster;
// without it the demo starts an embedded Kafka-protocol broker. The demo
// works in a fresh schema (millrace_demo_...) that it drops at the end
// unless -keep is given. Progress goes to stderr, the summary to stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/millrace/millrace/devbroker"
)

// config is what one run of the demo does.
type config struct {
	DatabaseURL string        // the PostgreSQL database to work in
	Brokers     []string      // Kafka bootstrap brokers; empty starts an embedded broker
	Orders      int           // orders to place
	Customers   int           // distinct customers, which are the partition keys
	Writers     int           // goroutines placing orders concurrently
	RejectEvery int           // every RejectEvery-th order fails validation and rolls back
	Timeout     time.Duration // the longest wait for the pipeline to catch up
	Keep        bool          // keep the demo's schema for a look with psql
	Log         io.Writer     // progress and warnings
}

func main() {
	cfg := config{
		DatabaseURL: os.Getenv("DATABASE_URL"),
		Brokers:     devbroker.EnvBrokers(),
		Writers:     4,
		RejectEvery: 50,
		Log:         os.Stderr,
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	quiet := flag.Bool("quiet", false, "print only the summary (no progress on stderr)")
	flag.IntVar(&cfg.Orders, "orders", 2000, "number of orders to place")
	flag.IntVar(&cfg.Customers, "customers", 100, "number of customers (partition keys)")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the demo's schema instead of dropping it")
	flag.DurationVar(&cfg.Timeout, "timeout", time.Minute, "give up waiting for billing after this long")
	flag.Parse()
	if *quiet {
		cfg.Log = io.Discard
	}
	if cfg.Orders < 2 || cfg.Customers < 1 {
		fmt.Fprintln(os.Stderr, "demo: -orders must be at least 2 and -customers at least 1")
		os.Exit(2)
	}

	// Ctrl-C stops the demo cleanly: everything it started is stopped and its
	// schema dropped.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	sum, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	sum.print(os.Stdout)
	if failed := sum.failed(); len(failed) > 0 {
		fmt.Fprintf(os.Stderr, "demo: %d check(s) failed: %s\n", len(failed), failed[0].Detail)
		os.Exit(1)
	}
}

// run plays the story of the package comment and returns what it saw. It
// returns an error only when the demo could not run (no database, no
// broker); a guarantee that did not hold is a failed check in the summary.
func run(ctx context.Context, cfg config) (*summary, error) {
	say := func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "demo: "+format+"\n", args...)
	}

	// Set up: a schema of our own, migrated; the business tables; Kafka.
	env, err := setUp(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.tearDown(cfg, say)
	say("PostgreSQL schema %s migrated; Kafka at %s (%s); topics %s, %s",
		env.schema, env.brokerList(), env.kafkaKind(), env.ordersTopic, env.invoicesTopic)

	orders, err := newOrdersService(env)
	if err != nil {
		return nil, err
	}

	// Two relays ship the outbox to Kafka. Each is a separate outbox.Relay,
	// as it would be in two replicas of the orders service; they share the
	// work by locking lanes of partition keys.
	relayA, err := startRelay(env, "relay-a")
	if err != nil {
		return nil, err
	}
	defer relayA.stop()
	relayB, err := startRelay(env, "relay-b")
	if err != nil {
		return nil, err
	}
	defer relayB.stop()

	// The billing service, consuming OrderPlaced from Kafka.
	billing, err := startBilling(ctx, env)
	if err != nil {
		return nil, err
	}
	defer billing.stop()

	sum := &summary{cfg: cfg, schema: env.schema, kafka: env.kafkaKind()}
	progress := startProgress(env, cfg.Log, orders, billing, relayA, relayB)
	defer progress.stop()
	started := time.Now()

	// The first half of the orders, with both relays running.
	half := int64(cfg.Orders / 2)
	say("placing orders 1-%d from %d goroutines (every %dth fails validation and rolls back)", half, cfg.Writers, cfg.RejectEvery)
	if err := orders.placeOrders(ctx, 1, half, cfg); err != nil {
		return nil, err
	}

	// relay-a goes away. Its lanes are free as soon as its last batch
	// commits; relay-b's next claim takes them.
	relayA.stop()
	sum.firstHalfCommitted, _ = orders.counts()
	sum.relayAPublished = relayA.published()
	relayBBefore := relayB.published()
	say("relay-a stopped after publishing %d events; relay-b takes over its lanes", sum.relayAPublished)

	say("placing orders %d-%d", half+1, cfg.Orders)
	if err := orders.placeOrders(ctx, half+1, int64(cfg.Orders), cfg); err != nil {
		return nil, err
	}
	committed, rejected := orders.counts()
	say("orders done: %d committed, %d rolled back; waiting for billing", committed, len(rejected))

	// Wait until billing has handled every committed order and the outbox
	// is empty again (the invoices went out too).
	if err := waitFor(ctx, cfg.Timeout, func(ctx context.Context) (bool, error) {
		st, err := env.admin.Stats(ctx)
		return billing.deliveries.distinctOrders() >= committed && st.Pending == 0, err
	}); err != nil {
		sum.waitErr = fmt.Errorf("waiting for billing to handle %d orders: %w", committed, err)
	}
	sum.billedAt = time.Since(started)

	// An operator replays one customer's OrderPlaced events, say to rebuild
	// a read model downstream. They reach Kafka again with their original
	// event ids; billing has applied every one already, and its dedup skips
	// them: nobody is charged twice.
	if sum.waitErr == nil {
		sum.replay, err = replayCustomer(ctx, env)
		if err != nil {
			return nil, err
		}
		say("replayed %s's %d OrderPlaced events (outbox.Admin.Replay); waiting for the redeliveries",
			sum.replay.customer, sum.replay.events)
		if err := waitFor(ctx, cfg.Timeout, func(ctx context.Context) (bool, error) {
			st, err := env.admin.Stats(ctx)
			return billing.deliveries.allRedelivered(sum.replay.orderIDs) && st.Pending == 0, err
		}); err != nil {
			sum.waitErr = fmt.Errorf("waiting for the replayed events to reach billing: %w", err)
		}
	}
	sum.elapsed = time.Since(started)
	progress.stop()
	sum.relayBAfterStop = relayB.published() - relayBBefore
	sum.relayBPublished = relayB.published()

	// Stop consuming before reading the final state, so nothing changes
	// under the checks.
	billing.stop()
	if err := sum.collect(ctx, env, orders, billing); err != nil {
		return nil, err
	}
	return sum, nil
}

// waitFor polls cond every 50 ms until it holds, ctx ends, or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond(ctx)
		if ok && err == nil {
			return nil
		}
		if err != nil && ctx.Err() == nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if ctx.Err() != context.DeadlineExceeded {
				return ctx.Err()
			}
			if lastErr != nil {
				return fmt.Errorf("gave up after %s (last error: %v)", timeout, lastErr)
			}
			return fmt.Errorf("gave up after %s", timeout)
		case <-tick.C:
		}
	}
}
