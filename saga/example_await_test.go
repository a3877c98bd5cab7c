package saga_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// Purchase is the wait example's data.
type Purchase struct {
	ID         string `json:"id"`
	PaymentRef string `json:"payment_ref,omitempty"`
	Shipped    bool   `json:"shipped"`
}

// Confirmation is the payment provider's webhook body.
type Confirmation struct {
	Ref string `json:"ref"`
}

// A saga that waits for a payment provider's confirmation: the webhook's
// handler delivers it with SignalTx, in its own transaction. A repeated
// webhook applies once; one after the saga ended is refused.
func Example_await() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	purchases, err := saga.Define(saga.Spec[Purchase]{
		Type: "purchase", Version: 1,
		Steps: []saga.Step[Purchase]{
			{Name: "payment_confirmed", Kind: saga.Compensatable, Await: &saga.Await[Purchase]{
				Event: "payment.confirmed",
				OnEvent: saga.EventFunc(func(p *Purchase, c Confirmation) error {
					p.PaymentRef = c.Ref
					return nil
				}),
				Timeout:   15 * time.Minute,
				OnTimeout: saga.TimeoutCompensate,
			}},
			{Name: "ship", Kind: saga.Pivot, Local: func(ctx context.Context, tx pgx.Tx, p *Purchase) error {
				p.Shipped = true // and the service's own writes, in tx
				return nil
			}},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	o, err := saga.New(pool, saga.Config{Schema: schema})
	if err == nil {
		err = o.Register(purchases)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := saga.Start(ctx, o, purchases, "purchase-1", Purchase{ID: "purchase-1"}); err != nil {
		fmt.Println(err)
		return
	}

	// The webhook's handler: the provider's event id deduplicates it.
	webhook := func(eventID string, c Confirmation) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return saga.SignalTx(ctx, tx, o, "purchase-1", "payment.confirmed", eventID, c)
		})
	}
	fmt.Println("webhook:", webhook("evt_1", Confirmation{Ref: "pay_42"}))
	fmt.Println("again:", webhook("evt_1", Confirmation{Ref: "pay_42"}))

	in, err := o.Get(ctx, "purchase-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(in.Status, string(in.Data))

	err = saga.Signal(ctx, o, "purchase-1", "payment.confirmed", "evt_2", Confirmation{Ref: "pay_43"})
	fmt.Println("after the end:", errors.Is(err, saga.ErrSagaEnded))
	// Output:
	// webhook: <nil>
	// again: <nil>
	// completed {"id": "purchase-1", "shipped": true, "payment_ref": "pay_42"}
	// after the end: true
}
