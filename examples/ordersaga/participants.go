package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
)

// The commands and replies the order saga exchanges with its participants,
// as JSON.
type (
	ReserveCredit struct {
		Order    string `json:"order"`
		Customer string `json:"customer"`
		Amount   int64  `json:"amount"`
	}
	CreditReserved struct {
		Reservation int64 `json:"reservation"`
	}
	ReserveStock struct {
		Order string `json:"order"`
		SKU   string `json:"sku"`
		Qty   int    `json:"qty"`
	}
	BookShipment struct {
		Order    string `json:"order"`
		Customer string `json:"customer"`
		SKU      string `json:"sku"`
		Qty      int    `json:"qty"`
	}
	ShipmentBooked struct {
		Tracking string `json:"tracking"`
	}
)

// The participants' tables. Their ledgers are append-only and have no
// UNIQUE constraint on the saga: only the compensation barrier keeps an
// effect from being applied twice, and the demo's checks count.
const (
	paymentDDL = `
CREATE TABLE account (
    customer     text   PRIMARY KEY,
    credit_limit bigint NOT NULL,
    available    bigint NOT NULL CHECK (available >= 0)
);
CREATE TABLE credit_ledger (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id  text        NOT NULL,
    customer text        NOT NULL,
    kind     text        NOT NULL CHECK (kind IN ('reserve', 'release')),
    amount   bigint      NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);
-- Refunds an operator must look at before they go out.
CREATE TABLE release_hold (
    saga_id text PRIMARY KEY,
    reason  text NOT NULL
);`

	inventoryDDL = `
CREATE TABLE stock (
    sku     text    PRIMARY KEY,
    initial integer NOT NULL,
    on_hand integer NOT NULL CHECK (on_hand >= 0)
);
CREATE TABLE stock_ledger (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id text        NOT NULL,
    sku     text        NOT NULL,
    kind    text        NOT NULL CHECK (kind IN ('take', 'return')),
    qty     integer     NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);`

	shippingDDL = `
CREATE TABLE shipment (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    saga_id   text        NOT NULL, -- the shipping saga, a child of the order's
    order_id  text        NOT NULL,
    tracking  text        NOT NULL,
    booked_at timestamptz NOT NULL DEFAULT now()
);`
)

// participant is a running participant service: a compensation.Participant
// of its millrace.Service, on its command topic.
type participant struct {
	*service
	p *compensation.Participant
}

// startParticipant sets up a participant service and starts consuming its
// command topic.
func startParticipant(ctx context.Context, cfg config, lg *logger, name, ddl string,
	seed func(context.Context, *service) error, register func(*compensation.Participant) error) (*participant, error) {
	n := names{cfg.Name}
	s, err := newService(ctx, cfg, name, ddl, lg)
	if err != nil {
		return nil, err
	}
	if err := seed(ctx, s); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: seed: %w", name, err)
	}
	p, err := s.svc.AddParticipant(name, n.commands(name))
	if err == nil {
		err = register(p)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s.start()
	return &participant{service: s, p: p}, nil
}

// paymentFaults is what the payment service does wrong on purpose.
type paymentFaults struct {
	flaky string // the saga whose credit release fails twice before it succeeds
	mu    sync.Mutex
	tries map[string]int
}

// startPayment starts the payment service: reserve_credit takes credit
// from the customer's account, and its compensation gives it back.
func startPayment(ctx context.Context, cfg config, lg *logger, plan *plan) (*participant, error) {
	faults := &paymentFaults{tries: map[string]int{}}
	if cfg.Faults {
		faults.flaky = plan.flakyRelease
	}
	seed := func(ctx context.Context, s *service) error {
		var customers []string
		var limits []int64
		for _, c := range plan.customers {
			customers, limits = append(customers, c.id), append(limits, c.credit)
		}
		if _, err := s.pool.Exec(ctx, `INSERT INTO account (customer, credit_limit, available)
SELECT c, l, l FROM unnest($1::text[], $2::bigint[]) AS t(c, l)`, customers, limits); err != nil {
			return err
		}
		if cfg.Faults {
			_, err := s.pool.Exec(ctx, `INSERT INTO release_hold (saga_id, reason) VALUES ($1, $2)`,
				plan.heldRelease, "refund held for review")
			return err
		}
		return nil
	}
	if cfg.PaymentCmd != "" {
		return startPythonPayment(ctx, cfg, lg, plan, seed) // python.go
	}
	register := func(p *compensation.Participant) error {
		return compensation.Register(p, "reserve_credit",
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) (CreditReserved, error) {
				tag, err := tx.Exec(ctx, `UPDATE account SET available = available - $2 WHERE customer = $1 AND available >= $2`,
					cmd.Customer, cmd.Amount)
				if err != nil {
					return CreditReserved{}, err // technical: rolled back and retried
				}
				if tag.RowsAffected() == 0 {
					return CreditReserved{}, compensation.Fail("insufficient credit")
				}
				var id int64
				err = tx.QueryRow(ctx, `INSERT INTO credit_ledger (saga_id, customer, kind, amount) VALUES ($1, $2, 'reserve', $3) RETURNING id`,
					call.SagaID, cmd.Customer, cmd.Amount).Scan(&id)
				return CreditReserved{Reservation: id}, err
			},
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) error {
				var reason string
				err := tx.QueryRow(ctx, `SELECT reason FROM release_hold WHERE saga_id = $1`, call.SagaID).Scan(&reason)
				switch {
				case err == nil:
					lg.fault("payment: release of %s's credit refused: %s (every retry fails: the saga will be stuck)", call.SagaID, reason)
					return compensation.Fail(reason)
				case err != pgx.ErrNoRows:
					return err
				}
				if call.SagaID == faults.flaky {
					faults.mu.Lock()
					faults.tries[call.SagaID]++
					n := faults.tries[call.SagaID]
					faults.mu.Unlock()
					if n <= 2 {
						lg.fault("payment: release of %s's credit fails (%d of 2, injected); the orchestrator retries it with backoff", call.SagaID, n)
						return compensation.Fail("ledger busy")
					}
					lg.fault("payment: release of %s's credit succeeds on try %d", call.SagaID, n)
				}
				if _, err := tx.Exec(ctx, `UPDATE account SET available = available + $2 WHERE customer = $1`, cmd.Customer, cmd.Amount); err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `INSERT INTO credit_ledger (saga_id, customer, kind, amount) VALUES ($1, $2, 'release', $3)`,
					call.SagaID, cmd.Customer, cmd.Amount)
				return err
			})
	}
	return startParticipant(ctx, cfg, lg, "payment", paymentDDL, seed, register)
}

// startInventory starts the inventory service: reserve_stock takes stock,
// and its compensation returns it.
func startInventory(ctx context.Context, cfg config, lg *logger, plan *plan) (*participant, error) {
	seed := func(ctx context.Context, s *service) error {
		var skus []string
		var qty []int32
		for _, k := range plan.skus {
			skus, qty = append(skus, k.id), append(qty, int32(k.stock))
		}
		_, err := s.pool.Exec(ctx, `INSERT INTO stock (sku, initial, on_hand)
SELECT s, q, q FROM unnest($1::text[], $2::int[]) AS t(s, q)`, skus, qty)
		return err
	}
	register := func(p *compensation.Participant) error {
		return compensation.Register(p, "reserve_stock",
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveStock) (struct{}, error) {
				tag, err := tx.Exec(ctx, `UPDATE stock SET on_hand = on_hand - $2 WHERE sku = $1 AND on_hand >= $2`, cmd.SKU, cmd.Qty)
				if err != nil {
					return struct{}{}, err
				}
				if tag.RowsAffected() == 0 {
					return struct{}{}, compensation.Fail("out of stock")
				}
				if _, err := tx.Exec(ctx, `INSERT INTO stock_ledger (saga_id, sku, kind, qty) VALUES ($1, $2, 'take', $3)`,
					call.SagaID, cmd.SKU, cmd.Qty); err != nil {
					return struct{}{}, err
				}
				return struct{}{}, nil
			},
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveStock) error {
				if _, err := tx.Exec(ctx, `UPDATE stock SET on_hand = on_hand + $2 WHERE sku = $1`, cmd.SKU, cmd.Qty); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `INSERT INTO stock_ledger (saga_id, sku, kind, qty) VALUES ($1, $2, 'return', $3)`,
					call.SagaID, cmd.SKU, cmd.Qty)
				return err
			})
	}
	p, err := startParticipant(ctx, cfg, lg, "inventory", inventoryDDL, seed, register)
	if err == nil && cfg.Faults {
		// The reply to one saga's first reserve_stock is late: inventory
		// took the stock and answered, but the answer reaches Kafka only
		// after the step's timeout. The saga sends attempt 2, which the
		// barrier answers with the stored reply (the stock is taken once);
		// the late reply of attempt 1 is fenced.
		p.dup.late = func(msg *message.Message) bool {
			return msg.Metadata.Get(core.MetadataSagaID) == plan.slowStock &&
				msg.Metadata.Get(core.MetadataSagaAttempt) == "1" &&
				msg.Metadata.Get(core.MetadataSagaOperation) == core.OperationAction
		}
		p.dup.onLate = func(msg *message.Message) {
			lg.fault("inventory: its reply to %s's reserve_stock (attempt 1, stock taken) is held back %s, past the step's %s timeout",
				plan.slowStock, stockLate, stockTimeout)
		}
	}
	return p, err
}

// carrierFailures is how many times the carrier's API fails for a
// shipment it is flaky on.
const carrierFailures = 2

// shippingStats counts the carrier's failures.
type shippingStats struct {
	mu       sync.Mutex
	tries    map[string]int
	logged   string // the saga whose carrier failures are logged (the first one)
	failures atomic.Int64
}

// startShipping starts the shipping service: book_shipment books a
// shipment with the carrier, for the order saga's shipping child saga. It
// is that saga's pivot, after the order's, so it has no compensation; the
// carrier's API fails now and then.
func startShipping(ctx context.Context, cfg config, lg *logger, plan *plan) (*participant, *shippingStats, error) {
	st := &shippingStats{tries: map[string]int{}}
	seed := func(context.Context, *service) error { return nil }
	register := func(p *compensation.Participant) error {
		return compensation.Register(p, "book_shipment",
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd BookShipment) (ShipmentBooked, error) {
				if cfg.Faults && plan.flakyCarrier(cmd.Order) {
					st.mu.Lock()
					st.tries[call.SagaID]++
					n := st.tries[call.SagaID]
					if st.logged == "" {
						st.logged = call.SagaID
					}
					logIt := st.logged == call.SagaID
					st.mu.Unlock()
					if n <= carrierFailures {
						// A technical error: this transaction rolls back,
						// nothing is replied, and the command is tried
						// again (nacked and delivered again).
						st.failures.Add(1)
						if logIt {
							lg.fault("shipping: carrier API down for %s (call %d of %d fails; the command is retried, nothing is booked or replied)",
								call.SagaID, n, carrierFailures+1)
						}
						return ShipmentBooked{}, fmt.Errorf("carrier API: 503 for order %s", cmd.Order)
					}
					if logIt {
						lg.fault("shipping: carrier books %s on call %d", call.SagaID, n)
					}
				}
				tracking := "TRK-" + cmd.Order
				_, err := tx.Exec(ctx, `INSERT INTO shipment (saga_id, order_id, tracking) VALUES ($1, $2, $3)`, call.SagaID, cmd.Order, tracking)
				return ShipmentBooked{Tracking: tracking}, err
			},
			nil) // after the pivot: never compensated
	}
	p, err := startParticipant(ctx, cfg, lg, "shipping", shippingDDL, seed, register)
	return p, st, err
}
