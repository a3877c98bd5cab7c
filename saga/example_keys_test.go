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

// Charge is the correlation example's data: the payment provider's id
// for the charge is known when the saga starts.
type Charge struct {
	Order     string  `json:"order"`
	Customer  string  `json:"customer"`
	Amount    float64 `json:"amount"`
	PaymentID string  `json:"payment_id"`
	Ref       string  `json:"ref,omitempty"`
}

// A payment provider's webhook knows its own payment id, not the saga id:
// the saga declares the payment id as a unique correlation key and the
// handler delivers the event by it (SignalByKeyTx). A second saga with
// the same payment id is refused at its start; once the saga ended, the
// key is no longer held. Customer and amount are search attributes: List
// filters by them. An operator sends an event a sender lost with
// Orchestrator.Signal.
func Example_correlationKey() {
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

	charges, err := saga.Define(saga.Spec[Charge]{
		Type: "charge", Version: 1,
		Steps: []saga.Step[Charge]{
			{Name: "paid", Kind: saga.Compensatable, Await: &saga.Await[Charge]{
				Event: "payment.confirmed",
				OnEvent: saga.EventFunc(func(c *Charge, e Confirmation) error {
					c.Ref = e.Ref
					return nil
				}),
				Timeout: time.Hour, OnTimeout: saga.TimeoutCompensate,
			}},
			{Name: "ship", Kind: saga.Pivot, Local: func(context.Context, pgx.Tx, *Charge) error { return nil }},
		},
		Keys: []saga.Key[Charge]{{Name: "payment_id", Unique: true, Value: func(c Charge) string { return c.PaymentID }}},
		Attributes: []saga.Attr[Charge]{
			{Name: "customer", Text: func(c Charge) string { return c.Customer }},
			{Name: "amount", Number: func(c Charge) float64 { return c.Amount }},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	o, err := saga.New(pool, saga.Config{Schema: schema})
	if err == nil {
		err = o.Register(charges)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, c := range []Charge{{Order: "o-1", Customer: "ada", Amount: 120, PaymentID: "pi_1"}, {Order: "o-2", Customer: "ada", Amount: 30, PaymentID: "pi_2"}} {
		if _, err := saga.Start(ctx, o, charges, c.Order, c); err != nil {
			fmt.Println(err)
			return
		}
	}
	_, err = saga.Start(ctx, o, charges, "o-3", Charge{Order: "o-3", PaymentID: "pi_1"})
	fmt.Println("same payment id:", errors.Is(err, saga.ErrKeyTaken))

	list, err := o.List(ctx, saga.ListParams{Attrs: []string{"customer=ada", "amount>100"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ada's orders over 100:", len(list.Sagas), list.Sagas[0].ID)

	// The webhook's handler: the provider's payment id finds the saga.
	webhook := func(paymentID, eventID string, c Confirmation) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return saga.SignalByKeyTx(ctx, tx, o, "charge", "payment_id", paymentID, "payment.confirmed", eventID, c)
		})
	}
	fmt.Println("webhook:", webhook("pi_1", "evt_1", Confirmation{Ref: "ch_1"}))
	in, err := o.Get(ctx, "o-1")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(in.Status)
	err = saga.SignalByKey(ctx, o, "charge", "payment_id", "pi_1", "payment.confirmed", "evt_2", nil)
	fmt.Println("after the end:", errors.Is(err, saga.ErrKeyNotHeld))

	// The provider never called for pi_2, but confirmed it by phone: an
	// operator sends the event (recorded in the history and the audit
	// trail), here by the key as well.
	err = o.Signal(ctx, saga.EventTarget{Type: "charge", Key: "payment_id", Value: "pi_2", Event: "payment.confirmed"},
		Confirmation{Ref: "ch_2"}, saga.Actor{Operator: "ada", Reason: "confirmed by phone"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if in, err = o.Get(ctx, "o-2"); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("o-2:", in.Status)
	// Output:
	// same payment id: true
	// ada's orders over 100: 1 o-1
	// webhook: <nil>
	// completed
	// after the end: true
	// o-2: completed
}
