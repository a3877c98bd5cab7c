package opstest

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/saga"
)

// Order is the data of the operator tools' test sagas.
type Order struct {
	ID       string `json:"id"`
	Reserved bool   `json:"reserved"`
	// Customer and Amount are the search attributes of the refund, ship
	// and pay sagas; PaymentID is the pay sagas' unique correlation key,
	// Paid what their event said.
	Customer  string  `json:"customer,omitempty"`
	Amount    float64 `json:"amount,omitempty"`
	PaymentID string  `json:"payment_id,omitempty"`
	Paid      string  `json:"paid,omitempty"`
}

// attrs are the test sagas' search attributes: customer and amount.
var attrs = []saga.Attr[Order]{
	{Name: "customer", Text: func(o Order) string { return o.Customer }},
	{Name: "amount", Number: func(o Order) float64 { return o.Amount }},
}

// Sagas holds the test saga definitions, registered with an Orchestrator
// on the test's schema, and makes sagas in the states an operator meets.
//
//   - "refund" sagas get stuck compensating: step reserve (local,
//     compensatable) succeeds, step charge (local, the pivot) fails for
//     good, and reserve's local compensation fails (one attempt) until Fix
//     is set: the saga is stuck, and an operator Retry then finishes it
//     (compensated).
//   - "ship" sagas wait on a participant: step reserve (remote,
//     compensatable, a command to topic "opstest.stock") has been sent and
//     nobody replies; step ship (local, the pivot) follows.
//   - "pay" sagas wait for event "payment.confirmed" (step paid, a wait),
//     then step ship (local, the pivot) sets Paid from its payload's
//     "ref"; their PaymentID is a unique correlation key (payment_id).
//   - "book" sagas end compensated around a parallel group: steps
//     reserve_stock and reserve_credit (local, compensatable, parallel
//     group "reserve") succeed, step charge (local, the pivot) fails for
//     good, both reservations are compensated, and step notify (local,
//     retriable) is never reached.
type Sagas struct {
	O      *saga.Orchestrator
	Refund *saga.Definition[Order]
	Ship   *saga.Definition[Order]
	Book   *saga.Definition[Order]
	Pay    *saga.Definition[Order]
	// Fix, once set, makes the refund sagas' compensation succeed.
	Fix atomic.Bool
}

// NewSagas returns the definitions registered with a new Orchestrator on
// db's schema.
func NewSagas(t testing.TB, db *pgtest.DB) *Sagas {
	t.Helper()
	s := &Sagas{}
	var err error
	s.Refund, err = saga.Define(saga.Spec[Order]{
		Type: "refund", Version: 1,
		Steps: []saga.Step[Order]{
			{Name: "reserve", Kind: saga.Compensatable,
				Local: func(_ context.Context, _ pgx.Tx, d *Order) error { d.Reserved = true; return nil },
				LocalCompensation: func(_ context.Context, _ pgx.Tx, d *Order) error {
					if !s.Fix.Load() {
						return errors.New("stock service says: no such reservation")
					}
					d.Reserved = false
					return nil
				},
				CompensationRetry: saga.RetryPolicy{MaxAttempts: 1}},
			{Name: "charge", Kind: saga.Pivot,
				Local: func(context.Context, pgx.Tx, *Order) error { return saga.Fail("card declined") }},
		},
		Attributes: attrs,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Ship, err = saga.Define(saga.Spec[Order]{
		Type: "ship", Version: 1,
		Steps: []saga.Step[Order]{
			{Name: "reserve", Kind: saga.Compensatable, Action: &saga.Command[Order]{Topic: "opstest.stock"},
				Compensation: &saga.Command[Order]{}},
			{Name: "ship", Kind: saga.Pivot,
				Local: func(context.Context, pgx.Tx, *Order) error { return nil }},
		},
		Attributes: attrs,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Pay = pay(t)
	ok := func(context.Context, pgx.Tx, *Order) error { return nil }
	s.Book, err = saga.Define(saga.Spec[Order]{
		Type: "book", Version: 1,
		Steps: []saga.Step[Order]{
			{Name: "reserve_stock", Kind: saga.Compensatable, Group: "reserve", Local: ok, LocalCompensation: ok},
			{Name: "reserve_credit", Kind: saga.Compensatable, Group: "reserve", Local: ok, LocalCompensation: ok},
			{Name: "charge", Kind: saga.Pivot,
				Local: func(context.Context, pgx.Tx, *Order) error { return saga.Fail("card declined") }},
			{Name: "notify", Kind: saga.Retriable, Local: ok, Retry: saga.RetryPolicy{MaxAttempts: 3}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.O = NewOrchestrator(t, db)
	if err := s.O.Register(s.Refund, s.Ship, s.Book, s.Pay); err != nil {
		t.Fatal(err)
	}
	return s
}

// pay defines the "pay" sagas (see Sagas).
func pay(t testing.TB) *saga.Definition[Order] {
	t.Helper()
	type payment struct {
		Ref string `json:"ref"`
	}
	def, err := saga.Define(saga.Spec[Order]{
		Type: "pay", Version: 1,
		Steps: []saga.Step[Order]{
			{Name: "paid", Kind: saga.Compensatable, Await: &saga.Await[Order]{Event: "payment.confirmed",
				OnEvent: saga.EventFunc(func(o *Order, p payment) error { o.Paid = p.Ref; return nil })}},
			{Name: "ship", Kind: saga.Pivot, Local: func(context.Context, pgx.Tx, *Order) error { return nil }},
		},
		Keys:       []saga.Key[Order]{{Name: "payment_id", Unique: true, Value: func(o Order) string { return o.PaymentID }}},
		Attributes: attrs,
	})
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// WaitingPay starts a pay saga with o, which waits for its payment.
func (s *Sagas) WaitingPay(t testing.TB, o Order) *saga.Instance {
	t.Helper()
	in, err := saga.Start(context.Background(), s.O, s.Pay, o.ID, o)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusRunning || in.Step != "paid" {
		t.Fatalf("pay saga %s: %s at %q, want running at paid", o.ID, in.Status, in.Step)
	}
	return in
}

// NewOrchestrator returns an Orchestrator on db's schema with no
// definitions registered.
func NewOrchestrator(t testing.TB, db *pgtest.DB) *saga.Orchestrator {
	t.Helper()
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// StuckRefund starts a refund saga with id, which ends stuck compensating
// step reserve.
func (s *Sagas) StuckRefund(t testing.TB, id string) *saga.Instance {
	t.Helper()
	return s.StuckRefundOf(t, Order{ID: id})
}

// StuckRefundOf is StuckRefund with the saga's data (o.ID its id).
func (s *Sagas) StuckRefundOf(t testing.TB, o Order) *saga.Instance {
	t.Helper()
	id := o.ID
	in, err := saga.Start(context.Background(), s.O, s.Refund, id, o)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusStuck || in.Step != "reserve" || in.Phase != saga.PhaseCompensating {
		t.Fatalf("refund saga %s: %s/%s at %q, want stuck compensating at reserve", id, in.Status, in.Phase, in.Step)
	}
	return in
}

// WaitingShip starts a ship saga with id, which waits for the reply to
// step reserve's command.
func (s *Sagas) WaitingShip(t testing.TB, id string) *saga.Instance {
	t.Helper()
	in, err := saga.Start(context.Background(), s.O, s.Ship, id, Order{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusRunning || in.Step != "reserve" {
		t.Fatalf("ship saga %s: %s at %q, want running at reserve", id, in.Status, in.Step)
	}
	return in
}

// CompensatedBook starts a book saga with id, which ends compensated: its
// parallel group's steps compensated, charge failed, notify not started.
func (s *Sagas) CompensatedBook(t testing.TB, id string) *saga.Instance {
	t.Helper()
	in, err := saga.Start(context.Background(), s.O, s.Book, id, Order{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompensated {
		t.Fatalf("book saga %s: %s, want compensated", id, in.Status)
	}
	return in
}

// ShippingParent starts a saga with id whose first step (its pivot) is a
// child step starting a ship saga: the child, id + "/shipping/1", waits
// for the reply to its step reserve. It returns the parent.
func (s *Sagas) ShippingParent(t testing.TB, id string) *saga.Instance {
	t.Helper()
	def, err := saga.Define(saga.Spec[Order]{Type: "ship-parent", Version: 1, Steps: []saga.Step[Order]{
		{Name: "shipping", Kind: saga.Pivot, Child: &saga.Child[Order]{Definition: s.Ship}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	in, err := saga.Start(context.Background(), s.O, def, id, Order{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if child := s.Get(t, id+"/shipping/1"); in.Step != "shipping" || child.Parent != id || child.Step != "reserve" {
		t.Fatalf("saga %s at %q with child %+v", id, in.Step, child)
	}
	return in
}

// Get returns the saga with id as stored.
func (s *Sagas) Get(t testing.TB, id string) *saga.Instance {
	t.Helper()
	in, err := s.O.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// StuckRefunds makes n refund sagas stuck compensating step reserve, with
// ids prefix-0001, prefix-0002, ...: the first started for real
// (StuckRefund), the others copies of its row in one INSERT (each with its
// own id in its data, and created a millisecond after the one before), so
// a thousand take no longer than one. It returns their ids in order.
func (s *Sagas) StuckRefunds(t testing.TB, db *pgtest.DB, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i+1)
	}
	if n == 0 {
		return ids
	}
	s.StuckRefund(t, ids[0])
	_, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (id, type, def_version, status, phase, step, steps, data, input, version,
       next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at, ended_at)
SELECT c.id, s.type, s.def_version, s.status, s.phase, s.step, s.steps,
       jsonb_set(s.data, '{id}', to_jsonb(c.id)), jsonb_set(s.input, '{id}', to_jsonb(c.id)), s.version,
       s.next_wakeup_at, s.deadline_at, s.attempts, s.last_error,
       s.created_at + c.ord * interval '1 millisecond', s.updated_at, s.ended_at
  FROM %[1]s s, unnest($2::text[]) WITH ORDINALITY AS c(id, ord)
 WHERE s.id = $1`, sqlident.Table(db.Schema, "saga_instance")), ids[0], ids[1:])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
