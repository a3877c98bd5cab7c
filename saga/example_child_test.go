package saga_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/saga"
)

// Booking is the child saga example's data; Shipment its child's.
type Booking struct {
	ID       string `json:"id"`
	Amount   int    `json:"amount"`
	Insured  bool   `json:"insured"`
	Tracking string `json:"tracking,omitempty"`
}

type Shipment struct {
	Booking  string `json:"booking"`
	Packed   bool   `json:"packed"`
	Tracking string `json:"tracking,omitempty"`
}

// A booking saga insures only bookings over 100 (a conditional step), and
// ships through a child saga of two steps, whose tracking number it takes
// back when the child completes. (The steps are local here, so the example
// needs no broker; remote steps work the same.)
func Example_childSaga() {
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

	shipping, err := saga.Define(saga.Spec[Shipment]{
		Type: "shipping", Version: 1,
		Steps: []saga.Step[Shipment]{
			{Name: "pack", Kind: saga.Compensatable,
				Local:             func(_ context.Context, _ pgx.Tx, s *Shipment) error { s.Packed = true; return nil },
				LocalCompensation: func(_ context.Context, _ pgx.Tx, s *Shipment) error { s.Packed = false; return nil }},
			{Name: "send", Kind: saga.Compensatable,
				Local:             func(_ context.Context, _ pgx.Tx, s *Shipment) error { s.Tracking = "TRK-" + s.Booking; return nil },
				LocalCompensation: func(_ context.Context, _ pgx.Tx, s *Shipment) error { s.Tracking = ""; return nil }},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	bookings, err := saga.Define(saga.Spec[Booking]{
		Type: "booking", Version: 1,
		Steps: []saga.Step[Booking]{
			{Name: "insure", Kind: saga.Compensatable, When: func(b Booking) bool { return b.Amount > 100 },
				Local:             func(_ context.Context, _ pgx.Tx, b *Booking) error { b.Insured = true; return nil },
				LocalCompensation: func(_ context.Context, _ pgx.Tx, b *Booking) error { b.Insured = false; return nil }},
			{Name: "ship", Kind: saga.Compensatable, Child: &saga.Child[Booking]{
				Definition: shipping,
				Data:       func(b Booking) (any, error) { return Shipment{Booking: b.ID}, nil },
				OnDone: func(b *Booking, child json.RawMessage) error {
					var s Shipment
					err := json.Unmarshal(child, &s)
					b.Tracking = s.Tracking
					return err
				},
			}},
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	o, err := saga.New(pool, saga.Config{Schema: schema})
	if err == nil {
		err = o.Register(bookings) // and shipping, its child
	}
	if err != nil {
		fmt.Println(err)
		return
	}

	// The child starts (and, all local, completes) in the start's
	// transaction; the orchestrator's timer pass (Run does it every
	// PollInterval) tells the parent.
	if _, err := saga.Start(ctx, o, bookings, "b-1", Booking{ID: "b-1", Amount: 50}); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := o.RunDue(ctx); err != nil {
		fmt.Println(err)
		return
	}
	parent, _ := o.Get(ctx, "b-1")
	children, _ := o.List(ctx, saga.ListParams{Parent: "b-1"})
	child := children.Sagas[0]
	var b Booking
	_ = json.Unmarshal(parent.Data, &b)
	fmt.Println("booking:", parent.Status, "insured:", b.Insured, "tracking:", b.Tracking)
	fmt.Println("insure:", parent.Steps["insure"].Status)
	fmt.Println("child:", child.ID, child.Type, child.Status, "parent:", child.Parent)
	// Output:
	// booking: completed insured: false tracking: TRK-b-1
	// insure: skipped
	// child: b-1/ship/1 shipping completed parent: b-1
}
