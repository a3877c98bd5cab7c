// Command ordersaga is millrace's main example, the one `make demo` runs:
// an order saga across four services that talk only through Kafka, with
// faults on, checked from the databases at the end.
//
//   - orders places an order and starts its saga in one transaction
//     (saga.StartTx), and runs the saga orchestrator (package saga) in its
//     millrace.Service: the saga's replies, many per transaction, and the
//     timers. After reserving
//     credit the saga waits for the payment provider's confirmation (a
//     wait step); the provider's webhook, which knows only its own payment
//     id, delivers it to the saga holding that id (a correlation key,
//     saga.SignalByKeyTx), for one order in three before the saga waits for it (it is stored
//     and consumed when the saga gets there), for one in five twice (it
//     applies once).
//   - payment reserves a customer's credit and releases it as compensation;
//     inventory reserves stock and returns it; shipping books the shipment
//     after the pivot, for a shipping saga of two steps (book the shipment,
//     record its tracking number) that the order saga starts as its child
//     (saga.Step.Child) and waits for (never compensated). Each is a
//     compensation.Participant: a barrier in front of the action and its
//     compensation, the reply through its outbox.
//
// Each service has its own schemas, as if in a database of its own: one for
// its tables (<name>_payment) and one for its millrace tables (outbox,
// inbox marks, the barrier or the saga state: <name>_payment_millrace),
// and runs one millrace.Service (millrace.New): its relay shipping its
// outbox to Kafka, its participant or its sagas, retention. Credit
// and stock are scarce, and the fraud check at approval (the pivot, a
// local step) refuses one order in 25, so some orders fail and are
// compensated: stock returned, credit released, order cancelled.
//
// Faults (on by default, -faults=false turns them off), each visible in the
// progress output:
//
//   - every 7th message a relay publishes is published twice: the inboxes
//     drop the duplicates;
//   - inventory answers one saga's reserve_stock too late (the stock is
//     taken, the reply held back past the step's timeout): the saga sends
//     attempt 2, the barrier answers it with the stored reply without
//     taking the stock again, and the late reply of attempt 1 is fenced;
//   - the orders service (its orchestrator and its relay) is stopped and
//     restarted mid-run (a new millrace.Service): it resumes every saga
//     from PostgreSQL;
//   - one saga's credit release fails twice, then succeeds: the
//     orchestrator retries the compensation with backoff;
//   - one saga's credit release fails until an operator lifts a hold on
//     the refund: the saga ends stuck; the operator finds it with
//     Orchestrator.List, fixes the cause and calls Orchestrator.Retry;
//   - the carrier's API fails twice for every fifth shipment: shipping's
//     transaction rolls back and the command is tried again.
//
// At the end it counts from the databases: sagas by status (saga_instance),
// lost events (outbox rows of every service with no inbox mark at their
// consumer), and double effects (ledger rows of payment and inventory,
// shipments, order statuses and child sagas that do not match their order
// saga's outcome one to one, and balances that do not match their
// ledgers). It prints a
// summary and, last, the line
//
//	demo: sagas=N completed=X compensated=Y stuck=0 lost_events=0 double_effects=0
//
// and exits 0 only if every check holds.
//
// Run it with
//
//	make demo                                 # finds or starts PostgreSQL first
//	go run ./examples/ordersaga -sagas 2000   # with DATABASE_URL set
//
// DATABASE_URL defaults to postgres://postgres@127.0.0.1:5432/test.
// KAFKA_BROKERS (comma-separated host:port) selects a Kafka cluster;
// without it the demo starts an embedded Kafka-protocol broker. The schemas
// (ordersaga_<random>_orders, ..._orders_millrace, ..._payment, ...) are
// dropped at the end unless -keep is given.
//
// # One process per service
//
// -service runs one service only. Give every process the same -name, the
// same -sagas and -seed (they derive the schemas, topics and plan from
// them), and one database (the orders process reads the other schemas for
// its checks, and its operator lifts the refund hold in payment's). Without
// KAFKA_BROKERS the orders process starts the embedded broker on
// 127.0.0.1:9092 and the others connect to it:
//
//	go run ./examples/ordersaga -service orders -name run1 &
//	go run ./examples/ordersaga -service payment -name run1 &
//	go run ./examples/ordersaga -service inventory -name run1 &
//	go run ./examples/ordersaga -service shipping -name run1
//
// The orders process waits for the other three, places the orders, checks
// and exits; stop the others with Ctrl-C. (The in-process faults, the
// restart of the orchestrator included, happen in the process of their
// service.)
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

// config is what one run does.
type config struct {
	DatabaseURL string
	Brokers     []string // empty: an embedded broker
	Service     string   // "all", or one of orders, payment, inventory, shipping
	Name        string   // prefix of the schemas, topics and consumer groups
	Sagas       int      // orders placed, one saga each
	Seed        uint64   // of the plan (customers, SKUs, orders)
	Writers     int      // goroutines placing orders
	Conns       int      // PostgreSQL connections per service (orders: 4 more)
	Rate        int      // orders placed per second in all; 0: as fast as they go
	Faults      bool
	Timeout     time.Duration // the longest wait for every saga to end
	Keep        bool          // keep the schemas
	BrokerPort  int           // the embedded broker's port when -service is not all
	PaymentCmd  string        // run the payment service as this shell command (payment.py; python.go)
	Log         io.Writer     // progress, faults, operator
	Out         io.Writer     // the summary and the last line
}

func main() {
	cfg := config{
		DatabaseURL: os.Getenv("DATABASE_URL"),
		Brokers:     devbroker.EnvBrokers(),
		Log:         os.Stderr,
		Out:         os.Stdout,
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	flag.StringVar(&cfg.Service, "service", "all", "run one service only: orders, payment, inventory or shipping")
	flag.StringVar(&cfg.Name, "name", "", "name of the run: prefix of schemas, topics and groups (default: random; \"ordersaga\" with -service)")
	flag.IntVar(&cfg.Sagas, "sagas", 500, "orders to place (one saga each)")
	flag.Uint64Var(&cfg.Seed, "seed", 1, "seed of the orders, customers and stock")
	flag.IntVar(&cfg.Writers, "writers", 8, "goroutines placing orders")
	flag.IntVar(&cfg.Conns, "conns", 8, "PostgreSQL connections per service (the orders service: 4 more)")
	flag.IntVar(&cfg.Rate, "rate", 50, "orders per second (0: as fast as possible)")
	flag.BoolVar(&cfg.Faults, "faults", true, "inject the faults")
	flag.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "give up waiting for the sagas to end after this long")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the schemas instead of dropping them")
	flag.IntVar(&cfg.BrokerPort, "broker-port", 9092, "port of the embedded broker the services share with -service")
	flag.StringVar(&cfg.PaymentCmd, "payment-cmd", "", "run the payment service as this shell command, the Python one: \"PYTHONPATH=python python3 examples/ordersaga/payment.py\" (make demo-polyglot)")
	flag.Parse()
	if cfg.Sagas < 12 || cfg.Writers < 1 || cfg.Rate < 0 || cfg.Conns < 2 {
		fmt.Fprintln(os.Stderr, "demo: -sagas must be at least 12, -writers at least 1, -rate not negative, -conns at least 2")
		os.Exit(2)
	}
	switch cfg.Service {
	case "all", "orders", "payment", "inventory", "shipping":
	default:
		fmt.Fprintf(os.Stderr, "demo: unknown -service %q (all, orders, payment, inventory, shipping)\n", cfg.Service)
		os.Exit(2)
	}
	if cfg.Name == "" {
		if cfg.Service == "all" {
			cfg.Name = "ordersaga_" + randomHex(4)
		} else {
			cfg.Name = "ordersaga"
		}
	}
	if err := checkName(cfg.Name); err != nil {
		fmt.Fprintln(os.Stderr, "demo: -name:", err)
		os.Exit(2)
	}

	// Ctrl-C stops the demo cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if cfg.Service != "all" && cfg.Service != "orders" {
		if err := serveParticipant(ctx, cfg); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
		return
	}
	res, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	res.print(cfg.Out)
	if !res.ok() {
		os.Exit(1)
	}
}
