package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/saga"
)

// Order is the order saga's data, stored as jsonb in saga_instance.
type Order struct {
	ID       string `json:"id"`
	Customer string `json:"customer"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
	Amount   int64  `json:"amount"`
	// Filled in from the participants' replies.
	CreditReservation int64  `json:"credit_reservation,omitempty"`
	Tracking          string `json:"tracking,omitempty"`
	// PaymentID is the payment provider's id for the order's charge: its
	// webhook knows this, not the saga id, and finds the saga by it (the
	// saga's correlation key payment_id, saga.SignalByKeyTx).
	PaymentID string `json:"payment_id"`
	// From the payment provider's confirmation (the wait step).
	PaymentRef string `json:"payment_ref,omitempty"`
}

// Shipment is the shipping child saga's data.
type Shipment struct {
	Order    string `json:"order"`
	Customer string `json:"customer"`
	SKU      string `json:"sku"`
	Qty      int    `json:"qty"`
	// From the shipping service's reply.
	Tracking string `json:"tracking,omitempty"`
}

// paymentID is the id the payment provider gives an order's charge.
func paymentID(order string) string {
	h := fnv.New64a()
	h.Write([]byte(order))
	return fmt.Sprintf("pi_%016x", h.Sum64())
}

// PaymentConfirmed is the payment provider's webhook: the charge of an
// order went through.
type PaymentConfirmed struct {
	Ref string `json:"ref"`
}

// The orders service's own table.
const ordersDDL = `
CREATE TABLE orders (
    id        text        PRIMARY KEY,
    customer  text        NOT NULL,
    sku       text        NOT NULL,
    qty       integer     NOT NULL,
    amount    bigint      NOT NULL,
    status    text        NOT NULL, -- new, accepted, approved, shipped; cancelled
    tracking  text,
    placed_at timestamptz NOT NULL DEFAULT now()
);`

// shippingSaga defines the shipping saga, a child of the order saga: book
// the shipment with the shipping service (its pivot, retried until it
// succeeds) and record its tracking number on the order (local).
func shippingSaga(n names) (*saga.Definition[Shipment], error) {
	return saga.Define(saga.Spec[Shipment]{
		Type: "shipping", Version: 1, ReplyTopic: n.replies(),
		Steps: []saga.Step[Shipment]{
			{
				Name: "book_shipment", Kind: saga.Pivot, Timeout: stepTimeout,
				Retry: saga.RetryPolicy{MaxAttempts: 10, MinBackoff: 200 * time.Millisecond, MaxBackoff: 2 * time.Second},
				Action: &saga.Command[Shipment]{Topic: n.commands("shipping"), Payload: func(s Shipment) (any, error) {
					return BookShipment{Order: s.Order, Customer: s.Customer, SKU: s.SKU, Qty: s.Qty}, nil
				}},
				OnSuccess: saga.Reply(func(s *Shipment, r ShipmentBooked) error {
					s.Tracking = r.Tracking
					return nil
				}),
			},
			{
				Name: "record_tracking", Kind: saga.Retriable,
				Retry: saga.RetryPolicy{MaxAttempts: 5, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second},
				Local: func(ctx context.Context, tx pgx.Tx, s *Shipment) error {
					_, err := tx.Exec(ctx, `UPDATE orders SET tracking = $2 WHERE id = $1`, s.Order, s.Tracking)
					return err
				},
			},
		},
	})
}

// orderSaga defines the order saga: accept the order (local), reserve
// credit (payment), wait for the payment provider's confirmation (a wait
// step: its webhook, delivered by the provider's payment id, a unique
// correlation key, with saga.SignalByKeyTx, sometimes before the saga
// waits for it), reserve stock (inventory), approve the order (local: the
// pivot; the fraud check refuses a few), ship it (a child saga: shippingSaga) and mark
// the order shipped (local). A failure before the pivot compensates in
// reverse: stock returned, credit released, order cancelled.
func orderSaga(n names, p *plan) (*saga.Definition[Order], error) {
	shipping, err := shippingSaga(n)
	if err != nil {
		return nil, err
	}
	setStatus := func(status string) func(ctx context.Context, tx pgx.Tx, o *Order) error {
		return func(ctx context.Context, tx pgx.Tx, o *Order) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = $2 WHERE id = $1`, o.ID, status)
			return err
		}
	}
	forward := saga.RetryPolicy{MaxAttempts: 5, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	undo := saga.RetryPolicy{MaxAttempts: 4, MinBackoff: 200 * time.Millisecond, MaxBackoff: time.Second}
	return saga.Define(saga.Spec[Order]{
		Type: "order", Version: 1, ReplyTopic: n.replies(),
		// The provider's payment id finds the saga (SignalByKey); an
		// operator finds a customer's orders by their attributes
		// (millrace saga list --attr customer=c-0001 --attr 'amount>50').
		Keys: []saga.Key[Order]{{Name: "payment_id", Unique: true, Value: func(o Order) string { return o.PaymentID }}},
		Attributes: []saga.Attr[Order]{
			{Name: "customer", Text: func(o Order) string { return o.Customer }},
			{Name: "amount", Number: func(o Order) float64 { return float64(o.Amount) }},
		},
		Steps: []saga.Step[Order]{
			{
				Name: "accept", Kind: saga.Compensatable,
				Local:             setStatus("accepted"),
				LocalCompensation: setStatus("cancelled"),
			},
			{
				Name: "reserve_credit", Kind: saga.Compensatable, Timeout: stepTimeout, Retry: forward, CompensationRetry: undo,
				Action: &saga.Command[Order]{Topic: n.commands("payment"), Payload: func(o Order) (any, error) {
					return ReserveCredit{Order: o.ID, Customer: o.Customer, Amount: o.Amount}, nil
				}},
				OnSuccess: saga.Reply(func(o *Order, r CreditReserved) error {
					o.CreditReservation = r.Reservation
					return nil
				}),
				Compensation: &saga.Command[Order]{}, // release: same topic, command and payload
			},
			{
				// The provider's webhook (webhook below); with no
				// confirmation in time, the order is compensated.
				Name: "payment_confirmed", Kind: saga.Compensatable,
				Await: &saga.Await[Order]{
					Event: eventPaymentConfirmed,
					OnEvent: saga.EventFunc(func(o *Order, c PaymentConfirmed) error {
						o.PaymentRef = c.Ref
						return nil
					}),
					Timeout: stepTimeout, OnTimeout: saga.TimeoutCompensate,
				},
			},
			{
				Name: "reserve_stock", Kind: saga.Compensatable, Timeout: stockTimeout, Retry: forward, CompensationRetry: undo,
				Action: &saga.Command[Order]{Topic: n.commands("inventory"), Payload: func(o Order) (any, error) {
					return ReserveStock{Order: o.ID, SKU: o.SKU, Qty: o.Qty}, nil
				}},
				Compensation: &saga.Command[Order]{},
			},
			{
				Name: "approve", Kind: saga.Pivot,
				Local: func(ctx context.Context, tx pgx.Tx, o *Order) error {
					if p.fraudulent(o.ID) {
						return saga.Fail("fraud check failed") // compensates: stock returned, credit released, order cancelled
					}
					return setStatus("approved")(ctx, tx, o)
				},
			},
			{
				// A saga of its own, started by this step (id
				// <order>/shipping/1) and waited for; registered with
				// this one.
				Name: "shipping", Kind: saga.Retriable, Retry: saga.RetryPolicy{MaxAttempts: 3},
				Child: &saga.Child[Order]{
					Definition: shipping,
					Data: func(o Order) (any, error) {
						return Shipment{Order: o.ID, Customer: o.Customer, SKU: o.SKU, Qty: o.Qty}, nil
					},
					OnDone: func(o *Order, child json.RawMessage) error {
						var s Shipment
						err := json.Unmarshal(child, &s)
						o.Tracking = s.Tracking
						return err
					},
				},
			},
			{
				Name: "complete", Kind: saga.Retriable, Retry: forward,
				Local: func(ctx context.Context, tx pgx.Tx, o *Order) error {
					_, err := tx.Exec(ctx, `UPDATE orders SET status = 'shipped', tracking = $2 WHERE id = $1`, o.ID, o.Tracking)
					return err
				},
			},
		},
	})
}

// sagaConsumer is the inbox consumer name of the orchestrator's replies.
const sagaConsumer = "orders-saga"

// ordersService places orders and runs their sagas (the orchestrator of
// its millrace.Service: the replies and the timers), and an operator.
type ordersService struct {
	*service
	cfg  config
	def  *saga.Definition[Order]
	plan *plan
	// api places orders (StartTx) and takes operator actions.
	api *saga.Orchestrator

	placed atomic.Int64
	// The payment provider's webhooks (webhook): in flight, accepted, and
	// refused because the saga had ended.
	webhooks                         sync.WaitGroup
	confirmations, lateConfirmations atomic.Int64
}

func startOrders(ctx context.Context, cfg config, lg *logger, p *plan) (*ordersService, error) {
	n := names{cfg.Name}
	s, err := newService(ctx, cfg, "orders", ordersDDL, lg)
	if err != nil {
		return nil, err
	}
	svc := &ordersService{service: s, cfg: cfg, plan: p}
	if svc.def, err = orderSaga(n, p); err == nil {
		err = s.svc.Orchestrator().Register(svc.def)
	}
	if err != nil {
		s.close()
		return nil, err
	}
	// The first service's orchestrator places orders and takes operator
	// actions for the whole run: it only writes to PostgreSQL, so it
	// serves while the service is stopped and after it was restarted.
	svc.api = s.svc.Orchestrator()
	s.start()
	return svc, nil
}

// restartOrchestrator stops the orders service (its orchestrator and its
// relay), waits pause, and runs a new millrace.Service in its place (the
// same Config, the same consumer group): it resumes every saga from
// PostgreSQL.
func (svc *ordersService) restartOrchestrator(ctx context.Context, pause time.Duration) error {
	inFlight, _ := svc.countLive(ctx)
	svc.stop()
	svc.log.fault("orders service stopped with %d sagas in flight; replies wait in Kafka, timers and commands in PostgreSQL", inFlight)
	select {
	case <-time.After(pause):
	case <-ctx.Done():
		return ctx.Err()
	}
	next, err := svc.newMillrace()
	if err == nil {
		err = next.Orchestrator().Register(svc.def)
	}
	if err != nil {
		return err
	}
	svc.mu.Lock()
	svc.svc = next
	svc.mu.Unlock()
	svc.start()
	svc.log.fault("orders service restarted (a new millrace.Service, same consumer group): it resumes every saga from its row")
	return nil
}

func (svc *ordersService) close() {
	svc.webhooks.Wait()
	svc.service.close()
}

// placeOrder places one order: the order row and its saga (the saga row,
// the leading local step and the first command, through the outbox) in one
// transaction.
func (svc *ordersService) placeOrder(ctx context.Context, o Order) error {
	o.PaymentID = paymentID(o.ID) // the provider's answer to the charge
	err := pgx.BeginFunc(ctx, svc.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, sku, qty, amount, status) VALUES ($1, $2, $3, $4, $5, 'new')`,
			o.ID, o.Customer, o.SKU, o.Qty, o.Amount); err != nil {
			return err
		}
		_, err := saga.StartTx(ctx, tx, svc.api, svc.def, o.ID, o)
		return err
	})
	if err != nil {
		return fmt.Errorf("place %s: %w", o.ID, err)
	}
	svc.placed.Add(1)
	svc.webhooks.Add(1)
	// Its own context: the provider calls whether or not more orders come.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	go func() { defer svc.webhooks.Done(); defer cancel(); svc.webhook(wctx, o.PaymentID) }()
	return nil
}

// eventPaymentConfirmed is the event the payment_confirmed step waits for.
const eventPaymentConfirmed = "payment.confirmed"

// webhook plays the payment provider calling the orders service's webhook
// endpoint for a charge, which it knows by its own payment id only: one
// order in three at once (before the saga has reserved credit, so before
// it waits: the event is stored and consumed when the saga gets there),
// the others a little later; one in five twice (the provider retries: the
// same event id applies once). The handler delivers it to the saga
// holding the payment id (saga.SignalByKeyTx) in a transaction of its
// own, as an HTTP handler would, and answers the provider; a charge whose
// saga has ended meanwhile (it failed at payment and was compensated) is
// refused: no running saga holds its payment id.
func (svc *ordersService) webhook(ctx context.Context, payment string) {
	h := fnv.New32a()
	h.Write([]byte(payment))
	n := h.Sum32()
	if n%3 != 0 {
		select {
		case <-time.After(time.Duration(20+n%180) * time.Millisecond):
		case <-ctx.Done():
			return
		}
	}
	times := 1
	if n%5 == 0 {
		times = 2
	}
	for range times {
		err := pgx.BeginFunc(ctx, svc.pool, func(tx pgx.Tx) error {
			return saga.SignalByKeyTx(ctx, tx, svc.api, "order", "payment_id", payment, eventPaymentConfirmed, "psp-"+payment,
				PaymentConfirmed{Ref: "ch_" + payment})
		})
		switch {
		case err == nil:
			svc.confirmations.Add(1)
		case errors.Is(err, saga.ErrKeyNotHeld) || errors.Is(err, saga.ErrSagaEnded):
			svc.lateConfirmations.Add(1)
		case ctx.Err() == nil:
			svc.log.say("payment webhook for %s: %v", payment, err)
		}
	}
}

// placeOrders places the plan's orders from cfg.Writers goroutines, at
// cfg.Rate orders per second in all (0: as fast as they go).
func (svc *ordersService) placeOrders(ctx context.Context) error {
	ch := make(chan Order)
	var wg sync.WaitGroup
	errc := make(chan error, svc.cfg.Writers)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range svc.cfg.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				if err := svc.placeOrder(wctx, o); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
	start := time.Now()
feed:
	for i, o := range svc.plan.orders {
		if svc.cfg.Rate > 0 {
			at := start.Add(time.Duration(i) * time.Second / time.Duration(svc.cfg.Rate))
			if d := time.Until(at); d > 0 {
				select {
				case <-time.After(d):
				case <-wctx.Done():
					break feed
				}
			}
		}
		select {
		case ch <- o:
		case <-wctx.Done():
			break feed
		}
	}
	close(ch)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return ctx.Err()
	}
}

// countLive counts the sagas not ended (running, compensating, stuck).
func (svc *ordersService) countLive(ctx context.Context) (int64, error) {
	var n int64
	err := svc.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{svc.mschema, "saga_instance"}.Sanitize()+
		` WHERE status IN ('running', 'compensating', 'stuck')`).Scan(&n)
	return n, err
}

// operator plays the person on call: it watches for stuck sagas through
// the saga API (List, Get, History), and for the one it expects (a refund
// on hold) lifts the hold in the payment service's database and retries
// the saga (Orchestrator.Retry). Any other stuck saga it leaves alone: the
// checks report it.
type operator struct {
	svc     *ordersService
	admin   *pgxpool.Pool
	seen    map[string]bool
	fixed   atomic.Int64
	unknown atomic.Int64
}

func (op *operator) watch(ctx context.Context) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := op.check(ctx); err != nil && ctx.Err() == nil {
			op.svc.log.say("operator: %v", err)
		}
	}
}

func (op *operator) check(ctx context.Context) error {
	page, err := op.svc.api.List(ctx, saga.ListParams{Type: "order", Status: saga.StatusStuck})
	if err != nil {
		return err
	}
	for _, in := range page.Sagas {
		if op.seen[in.ID] {
			continue
		}
		op.seen[in.ID] = true
		hist, err := op.svc.api.History(ctx, in.ID)
		if err != nil {
			return err
		}
		fails := 0
		for _, h := range hist {
			if h.Event == "reply" && h.Operation == "compensation" && h.Outcome == "failure" {
				fails++
			}
		}
		op.svc.log.say("operator: saga %s is stuck at step %s (%s phase): %q; %d history entries, %d failed compensation replies",
			in.ID, in.Step, in.Phase, in.LastError, len(hist), fails)
		if in.ID != op.svc.plan.heldRelease {
			op.unknown.Add(1)
			op.svc.log.say("operator: %s is not a planned fault; left stuck for the checks to report", in.ID)
			continue
		}
		// Fix the cause first, then retry the saga.
		if _, err := op.admin.Exec(ctx, `DELETE FROM `+pgx.Identifier{names{op.svc.cfg.Name}.schema("payment"), "release_hold"}.Sanitize()+
			` WHERE saga_id = $1`, in.ID); err != nil {
			return fmt.Errorf("lift the hold on %s: %w", in.ID, err)
		}
		after, err := op.svc.api.Retry(ctx, in.ID, saga.Actor{Operator: "ops@example.com", Reason: "refund reviewed, hold lifted"})
		if err != nil {
			return fmt.Errorf("retry %s: %w", in.ID, err)
		}
		op.fixed.Add(1)
		op.svc.log.say("operator: lifted the refund hold in payment's database and called Orchestrator.Retry(%s): %s again (status %s)",
			in.ID, after.Step, after.Status)
	}
	return nil
}
