package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/outbox"
)

// InvoiceIssued is the event billing publishes for each order it bills.
type InvoiceIssued struct {
	OrderID     int64  `json:"order_id"`
	CustomerID  string `json:"customer_id"`
	AmountCents int64  `json:"amount_cents"`
}

// billingConsumer is the name billing deduplicates under in processed_event.
const billingConsumer = "billing"

// billing is the billing service: a Watermill Router that consumes
// OrderPlaced from Kafka and bills each order exactly once.
type billing struct {
	pool          *pgxpool.Pool
	outbox        *outbox.Writer
	invoicesTopic string
	deliveries    *deliveryLog

	router   *message.Router
	done     chan error
	stopOnce sync.Once
}

func startBilling(ctx context.Context, e *env) (*billing, error) {
	w, err := outbox.NewWriter(e.pool, outbox.WriterConfig{Schema: e.schema})
	if err != nil {
		return nil, err
	}
	b := &billing{pool: e.pool, outbox: w, invoicesTopic: e.invoicesTopic, deliveries: newDeliveryLog(), done: make(chan error, 1)}

	// watermill-kafka's Subscriber reads what millrace's Kafka publisher
	// wrote (watermill-kafka's own record format), in a consumer group, one
	// message at a time per partition: each customer's events arrive in
	// order. sarama's consumer groups need a protocol version the brokers
	// speak; a new group starts at the oldest record.
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               e.brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         e.billingGroup,
	}, e.logger)
	if err != nil {
		return nil, err
	}
	// The dedup middleware: each message runs in a transaction that also
	// records its event id; a message whose id is recorded already is
	// acknowledged without running the handler.
	dedup, err := inbox.NewDeduplicator(e.pool, inbox.DedupConfig{Schema: e.schema, Consumer: billingConsumer})
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	b.router, err = message.NewRouter(message.RouterConfig{}, e.logger)
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	retry := middleware.Retry{
		MaxRetries:      5,
		InitialInterval: 50 * time.Millisecond,
		ShouldRetry:     inbox.ShouldRetry, // permanent errors are not retried
		Logger:          e.logger,
	}
	h := b.router.AddConsumerHandler("billing", e.ordersTopic, sub, b.handleOrderPlaced)
	// Outermost first: note the delivery for the demo's checks, retry a
	// failed handler, and deduplicate innermost so that every retry is a
	// fresh transaction. A production service would also put
	// middleware.PoisonQueue outermost, for messages that can never succeed.
	h.AddMiddleware(b.deliveries.middleware, retry.Middleware, dedup.Middleware)

	go func() { b.done <- b.router.Run(context.Background()) }()
	select {
	case <-b.router.Running():
		return b, nil
	case err := <-b.done:
		return nil, fmt.Errorf("billing router: %w", err)
	case <-ctx.Done():
		b.stop()
		return nil, ctx.Err()
	}
}

// handleOrderPlaced bills one order. It runs inside the dedup middleware's
// transaction: the balance update, the InvoiceIssued event and the
// processed_event mark commit together, or (on an error) none of them.
func (b *billing) handleOrderPlaced(msg *message.Message) error {
	var ev OrderPlaced
	if err := json.Unmarshal(msg.Payload, &ev); err != nil {
		return core.Permanent(fmt.Errorf("billing: OrderPlaced %s: %w", msg.UUID, err))
	}
	ctx := msg.Context()
	tx, ok := core.TxFromContext(ctx)
	if !ok {
		return errors.New("billing: no transaction in the message context (is the dedup middleware installed?)")
	}

	// Not idempotent on its own: applied twice, it would bill twice.
	tag, err := tx.Exec(ctx, `UPDATE customer_balance
   SET balance_cents = balance_cents + $2, orders_billed = orders_billed + 1
 WHERE customer_id = $1`, ev.CustomerID, ev.AmountCents)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return core.Permanent(fmt.Errorf("billing: order %d: unknown customer %q", ev.OrderID, ev.CustomerID))
	}

	// The invoice event goes through billing's outbox, in the same
	// transaction; the relays ship it after the commit.
	invoice, err := json.Marshal(InvoiceIssued{OrderID: ev.OrderID, CustomerID: ev.CustomerID, AmountCents: ev.AmountCents})
	if err != nil {
		return err
	}
	_, err = b.outbox.WriteTx(ctx, tx, outbox.Event{
		Topic:         b.invoicesTopic,
		PartitionKey:  ev.CustomerID,
		AggregateType: "invoice",
		AggregateID:   strconv.FormatInt(ev.OrderID, 10),
		EventType:     "InvoiceIssued",
		Payload:       invoice,
	})
	return err
}

// applied counts the events billing applied: its rows in processed_event.
func (b *billing) applied(ctx context.Context) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, `SELECT count(*) FROM processed_event WHERE consumer = $1`, billingConsumer).Scan(&n)
	return n, err
}

// stop closes the router, which waits for the handlers in progress and
// closes the subscriber. Stopping twice is a no-op.
func (b *billing) stop() {
	b.stopOnce.Do(func() {
		_ = b.router.Close()
		<-b.done
	})
}

// replayResult is what replayCustomer did.
type replayResult struct {
	customer      string
	orderIDs      []int64
	events        int64 // events queued for publishing again
	balanceBefore int64
	billedBefore  int64
}

// replayCustomer publishes the OrderPlaced events of the customer with the
// most orders again, with outbox.Admin's Replay, and notes the customer's
// balance before.
func replayCustomer(ctx context.Context, e *env) (replayResult, error) {
	var r replayResult
	err := e.pool.QueryRow(ctx, `
SELECT o.customer_id, b.balance_cents, b.orders_billed
  FROM orders o JOIN customer_balance b USING (customer_id)
 GROUP BY o.customer_id, b.balance_cents, b.orders_billed
 ORDER BY count(*) DESC, o.customer_id
 LIMIT 1`).Scan(&r.customer, &r.balanceBefore, &r.billedBefore)
	if err != nil {
		return r, fmt.Errorf("pick a customer to replay: %w", err)
	}
	rows, err := e.pool.Query(ctx, `SELECT id FROM orders WHERE customer_id = $1 ORDER BY customer_seq`, r.customer)
	if err != nil {
		return r, err
	}
	if r.orderIDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
		return r, err
	}

	// The OrderPlaced events are keyed by customer: replay that key's.
	r.events, err = e.admin.Replay(ctx, outbox.ReplayFilter{Topic: e.ordersTopic, PartitionKey: r.customer},
		core.Actor{Operator: "billing-rebuild", Reason: "rebuild " + r.customer + "'s billing from the log"})
	if err != nil {
		return r, fmt.Errorf("replay %s's orders: %w", r.customer, err)
	}
	return r, nil
}

// deliveryLog notes what billing was delivered, for the checks: how often
// each order's event arrived, and whether each customer's orders arrived
// in order.
type deliveryLog struct {
	mu         sync.Mutex
	total      int64
	perOrder   map[int64]int  // deliveries of each order's event
	lastSeq    map[string]int // per customer, the highest order number delivered
	outOfOrder []string       // what arrived out of order
}

func newDeliveryLog() *deliveryLog {
	return &deliveryLog{perOrder: map[int64]int{}, lastSeq: map[string]int{}}
}

// middleware notes each message that the handlers below it acknowledged
// (applied, or skipped as a duplicate).
func (l *deliveryLog) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		var ev OrderPlaced
		if err == nil && json.Unmarshal(msg.Payload, &ev) == nil {
			l.record(ev)
		}
		return out, err
	}
}

func (l *deliveryLog) record(ev OrderPlaced) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	l.perOrder[ev.OrderID]++
	if l.perOrder[ev.OrderID] > 1 {
		return // a redelivery: a replay, or Kafka's at-least-once
	}
	// A new order must be the customer's next one: orders 1, 2, 3, ...
	// with no gap (rolled-back orders took no number) and no swap.
	if want := l.lastSeq[ev.CustomerID] + 1; ev.CustomerSeq != want {
		l.outOfOrder = append(l.outOfOrder, fmt.Sprintf("%s's order #%d arrived when #%d was due", ev.CustomerID, ev.CustomerSeq, want))
	}
	l.lastSeq[ev.CustomerID] = max(l.lastSeq[ev.CustomerID], ev.CustomerSeq)
}

// distinctOrders counts the orders whose event arrived at least once.
func (l *deliveryLog) distinctOrders() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.perOrder))
}

// allRedelivered reports whether each order's event arrived at least twice.
func (l *deliveryLog) allRedelivered(orderIDs []int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range orderIDs {
		if l.perOrder[id] < 2 {
			return false
		}
	}
	return true
}

// snapshot returns the totals: deliveries, distinct orders delivered, the
// deliveries of the given orders, and what arrived out of order.
func (l *deliveryLog) snapshot(orderIDs []int64) (total, distinct, ofOrders int64, outOfOrder []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range orderIDs {
		ofOrders += int64(l.perOrder[id])
	}
	return l.total, int64(len(l.perOrder)), ofOrders, append([]string(nil), l.outOfOrder...)
}
