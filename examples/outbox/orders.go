package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/outbox"
)

// OrderPlaced is the event the orders service publishes, as JSON.
type OrderPlaced struct {
	OrderID     int64  `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	CustomerSeq int    `json:"customer_seq"` // the customer's n-th order: 1, 2, 3, ...
	AmountCents int64  `json:"amount_cents"`
}

// errValidation rejects an order. Returning it from the transaction's
// function rolls the transaction back.
var errValidation = errors.New("order failed validation")

// ordersService places orders. Each order is one transaction: the order
// row and its OrderPlaced event commit together or not at all.
type ordersService struct {
	pool   *pgxpool.Pool
	outbox *outbox.Writer
	topic  string

	committed atomic.Int64
	mu        sync.Mutex
	rejected  []int64 // ids of the orders that rolled back
}

func newOrdersService(e *env) (*ordersService, error) {
	w, err := outbox.NewWriter(e.pool, outbox.WriterConfig{Schema: e.schema})
	if err != nil {
		return nil, err
	}
	return &ordersService{pool: e.pool, outbox: w, topic: e.ordersTopic}, nil
}

// placeOrder places order id for a customer.
func (s *ordersService) placeOrder(ctx context.Context, id int64, customer string, amountCents int64, rejectIt bool) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Number the order within the customer's orders. The UPDATE locks
		// the customer's row until commit, so one customer's orders commit
		// one after another, in the order of their numbers; and the outbox
		// publishes events of one partition key in commit order.
		var seq int
		if err := tx.QueryRow(ctx,
			`UPDATE customer SET orders_placed = orders_placed + 1 WHERE id = $1 RETURNING orders_placed`,
			customer).Scan(&seq); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx,
			`INSERT INTO orders (id, customer_id, customer_seq, amount_cents) VALUES ($1, $2, $3, $4)`,
			id, customer, seq, amountCents); err != nil {
			return err
		}

		// The event, in the same transaction. The partition key is the
		// customer: billing sees each customer's orders in order.
		payload, err := json.Marshal(OrderPlaced{OrderID: id, CustomerID: customer, CustomerSeq: seq, AmountCents: amountCents})
		if err != nil {
			return err
		}
		if _, err := s.outbox.WriteTx(ctx, tx, outbox.Event{
			Topic:         s.topic,
			PartitionKey:  customer,
			AggregateType: "order",
			AggregateID:   strconv.FormatInt(id, 10),
			EventType:     "OrderPlaced",
			Payload:       payload,
		}); err != nil {
			return err
		}

		// A late validation failure: the transaction rolls back, and the
		// order, its number and its event vanish together. (The check runs
		// last on purpose, to show that an event already written goes too.)
		if rejectIt {
			return errValidation
		}
		return nil
	})
}

// placeOrders places orders from..to (inclusive) from cfg.Writers
// goroutines, each order for a random customer. Orders whose id is a
// multiple of cfg.RejectEvery fail validation.
func (s *ordersService) placeOrders(ctx context.Context, from, to int64, cfg config) error {
	ids := make(chan int64)
	errs := make(chan error, cfg.Writers)
	var wg sync.WaitGroup
	for range cfg.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				customer := customerID(1 + rand.IntN(cfg.Customers))
				amount := int64(100 + rand.IntN(100_000)) // $1.00 to $1,000.99
				reject := cfg.RejectEvery > 0 && id%int64(cfg.RejectEvery) == 0
				err := s.placeOrder(ctx, id, customer, amount, reject)
				switch {
				case err == nil:
					s.committed.Add(1)
				case errors.Is(err, errValidation):
					s.mu.Lock()
					s.rejected = append(s.rejected, id)
					s.mu.Unlock()
				default:
					errs <- fmt.Errorf("place order %d: %w", id, err)
					return
				}
			}
		}()
	}
	var err error
feed:
	for id := from; id <= to; id++ {
		select {
		case ids <- id:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(ids)
	wg.Wait()
	if err == nil && len(errs) > 0 {
		err = <-errs
	}
	return err
}

// counts returns how many orders committed and the ids of those rolled back.
func (s *ordersService) counts() (committed int64, rejected []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed.Load(), append([]int64(nil), s.rejected...)
}
