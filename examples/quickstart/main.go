// Command quickstart runs one order saga: an order and its saga commit in
// one transaction; payment reserves credit and inventory stock, behind the
// compensation barrier; the saga approves the order. All run here as one
// millrace.Service on one schema, through Kafka: KAFKA_BROKERS, else a
// broker in the process. DATABASE_URL=... go run ./examples/quickstart
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// Order is the saga's data, kept in its row.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	SKU      string `json:"sku"`
	Amount   int64  `json:"amount"`
}

// The tables of the three services, here in one schema.
const ddl = `
CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL);
CREATE TABLE IF NOT EXISTS account (customer text PRIMARY KEY, available bigint NOT NULL CHECK (available >= 0));
CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, on_hand integer NOT NULL CHECK (on_hand >= 0));
INSERT INTO account VALUES ('ada', 100) ON CONFLICT DO NOTHING;
INSERT INTO stock VALUES ('tea', 10) ON CONFLICT DO NOTHING;`

func main() {
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		b, err := devbroker.Start(devbroker.Config{})
		if err != nil {
			log.Fatal(err)
		}
		defer b.Close()
		brokers = b.Addrs()
	}
	in, err := run(context.Background(), os.Getenv("DATABASE_URL"), brokers, "quickstart")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("saga %s: %s\n", in.ID, in.Status)
}

// run sets up schema, starts the service, places one order and returns its
// saga once it ended.
func run(ctx context.Context, url string, brokers []string, schema string) (*saga.Instance, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema // the tables above, unqualified
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	// millrace's tables (outbox, inbox, barrier, saga state), then ours.
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, ddl)
	}
	if err != nil {
		return nil, err
	}

	// The saga: accept the order, reserve credit, reserve stock, approve
	// (the pivot). A failure before the pivot compensates in reverse.
	setStatus := func(status string) func(context.Context, pgx.Tx, *Order) error {
		return func(ctx context.Context, tx pgx.Tx, o *Order) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = $2 WHERE id = $1`, o.ID, status)
			return err
		}
	}
	orders, err := saga.Define(saga.Spec[Order]{
		Type: "order", Version: 1, ReplyTopic: schema + ".replies",
		Steps: []saga.Step[Order]{
			{Name: "accept", Kind: saga.Compensatable, // local: in the orchestrator's transaction
				Local: setStatus("accepted"), LocalCompensation: setStatus("cancelled")},
			{Name: "reserve_credit", Kind: saga.Compensatable,
				Action:       &saga.Command[Order]{Topic: schema + ".payment"},
				Compensation: &saga.Command[Order]{}}, // the same command, operation "compensation"
			{Name: "reserve_stock", Kind: saga.Compensatable,
				Action:       &saga.Command[Order]{Topic: schema + ".inventory"},
				Compensation: &saga.Command[Order]{}},
			{Name: "approve", Kind: saga.Pivot, Local: setStatus("approved")},
		},
	})
	if err != nil {
		return nil, err
	}

	// One value runs it all: the relay, the saga's replies and timers, the
	// participants, retention. Its parts take the schema, the brokers and
	// the logger from here.
	svc, err := millrace.New(pool, millrace.Config{Name: schema, Schema: schema, Brokers: brokers})
	if err != nil {
		return nil, err
	}
	orch := svc.Orchestrator()
	if err := orch.Register(orders); err != nil {
		return nil, err
	}

	// The participants: an action and its compensation, in the handler's
	// transaction, behind the barrier.
	err = participant(svc, "payment", schema+".payment", "reserve_credit",
		`UPDATE account SET available = available - $2 WHERE customer = $1 AND available >= $2`,
		`UPDATE account SET available = available + $2 WHERE customer = $1`,
		func(o Order) []any { return []any{o.Customer, o.Amount} })
	if err == nil {
		err = participant(svc, "inventory", schema+".inventory", "reserve_stock",
			`UPDATE stock SET on_hand = on_hand - 1 WHERE sku = $1 AND on_hand >= 1`,
			`UPDATE stock SET on_hand = on_hand + 1 WHERE sku = $1`,
			func(o Order) []any { return []any{o.SKU} })
	}
	if err != nil {
		_ = svc.Close()
		return nil, err
	}
	ctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() { stop(); <-done }()

	// The order and its saga commit together, or neither.
	o := Order{ID: uuid.NewString(), Customer: "ada", SKU: "tea", Amount: 30}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status) VALUES ($1, 'new')`, o.ID); err != nil {
			return err
		}
		_, err := saga.StartTx(ctx, tx, orch, orders, o.ID, o)
		return err
	})
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			return nil, err // the service stopped: a part failed
		default:
		}
		in, err := orch.Get(ctx, o.ID)
		if err != nil || in.Status != saga.StatusRunning && in.Status != saga.StatusCompensating {
			return in, err
		}
	}
	return nil, errors.New("the saga did not end within a minute")
}

// participant adds to svc a participant named name for the commands on
// topic, with one command: the action runs do, the compensation undo, each
// with args(order).
func participant(svc *millrace.Service, name, topic, command, do, undo string, args func(Order) []any) error {
	p, err := svc.AddParticipant(name, topic)
	if err != nil {
		return err
	}
	return compensation.Register(p, command,
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o Order) (struct{}, error) {
			if tag, err := tx.Exec(ctx, do, args(o)...); err != nil || tag.RowsAffected() == 1 {
				return struct{}{}, err // an error is technical: rolled back and retried, not replied
			}
			return struct{}{}, compensation.Fail("not enough") // replied: the saga compensates
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o Order) error {
			_, err := tx.Exec(ctx, undo, args(o)...) // only if the action ran, and once
			return err
		})
}
