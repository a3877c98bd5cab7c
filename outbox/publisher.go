package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
)

// ErrNoTx is returned by a context publisher when the message's context
// carries no transaction.
var ErrNoTx = errors.New("outbox: no transaction in the message context (use millrace.ContextWithTx, or the inbox middleware)")

// PartitionKeyFunc picks the partition key of a message published through
// the outbox's Watermill publisher.
type PartitionKeyFunc func(topic string, msg *message.Message) (string, error)

// DefaultPartitionKey takes the partition key from the message metadata:
// millrace.MetadataPartitionKey, else millrace.MetadataAggregateID.
func DefaultPartitionKey(_ string, msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(millrace.MetadataPartitionKey); k != "" {
		return k, nil
	}
	return msg.Metadata.Get(millrace.MetadataAggregateID), nil
}

// Publisher is a Watermill message.Publisher that writes messages to the
// outbox instead of a broker, in a PostgreSQL transaction: either a fixed
// one (TxPublisher) or the one in each message's context (ContextPublisher).
// Code written against Watermill, including its CQRS event bus, writes to the
// outbox unchanged. It is safe for concurrent use if its transaction is.
//
// Each message becomes one event: the message UUID is the event id (it must
// be a UUID), the topic is the event's topic, and the metadata travels as
// headers. The event type is metadata event_type, else "name" (what
// Watermill's CQRS marshalers set); aggregate_type and aggregate_id come from
// metadata of those names. A message whose content_type metadata is
// application/octet-stream is stored as binary, any other must be JSON.
type Publisher struct {
	w            *Writer
	tx           pgx.Tx
	partitionKey PartitionKeyFunc
}

// TxPublisher returns a Publisher that writes into tx. Use it for the
// length of tx only.
func (w *Writer) TxPublisher(tx pgx.Tx) *Publisher {
	return &Publisher{w: w, tx: tx, partitionKey: DefaultPartitionKey}
}

// ContextPublisher returns a Publisher that writes each message into the
// transaction carried by the message's context (millrace.TxFromContext).
// It is long-lived: make it once and hand it to Watermill components.
func (w *Writer) ContextPublisher() *Publisher {
	return &Publisher{w: w, partitionKey: DefaultPartitionKey}
}

// WithPartitionKey returns a copy of p that picks partition keys with fn.
func (p *Publisher) WithPartitionKey(fn PartitionKeyFunc) *Publisher {
	c := *p
	c.partitionKey = fn
	return &c
}

// Publish writes msgs to the outbox as events on topic, in one round trip
// per transaction. It fails as a whole: nothing is written if any message is
// invalid.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	events := make([]Event, len(msgs))
	for i, msg := range msgs {
		key, err := p.partitionKey(topic, msg)
		if err != nil {
			return fmt.Errorf("outbox: partition key of message %s: %w", msg.UUID, err)
		}
		md := msg.Metadata
		eventType := md.Get(millrace.MetadataEventType)
		if eventType == "" {
			eventType = md.Get("name")
		}
		events[i] = Event{
			ID:            msg.UUID,
			Topic:         topic,
			PartitionKey:  key,
			AggregateType: md.Get(millrace.MetadataAggregateType),
			AggregateID:   md.Get(millrace.MetadataAggregateID),
			EventType:     eventType,
			Payload:       msg.Payload,
			Binary:        md.Get(millrace.MetadataContentType) == millrace.ContentTypeBinary,
			Metadata:      md,
		}
		if msg.UUID == "" {
			// An empty id would be generated; a message must name its own.
			return &EventError{Index: i, Err: ErrInvalidEventID}
		}
	}
	if p.tx != nil {
		_, err := p.w.WriteTx(context.Background(), p.tx, events...)
		return err
	}
	// Messages may carry different transactions; write each group in turn.
	byTx := map[pgx.Tx][]Event{}
	var order []pgx.Tx
	for i, msg := range msgs {
		tx, ok := millrace.TxFromContext(msg.Context())
		if !ok {
			return fmt.Errorf("message %s: %w", msg.UUID, ErrNoTx)
		}
		if _, seen := byTx[tx]; !seen {
			order = append(order, tx)
		}
		byTx[tx] = append(byTx[tx], events[i])
	}
	for _, tx := range order {
		if _, err := p.w.WriteTx(msgs[0].Context(), tx, byTx[tx]...); err != nil {
			return err
		}
	}
	return nil
}

// Close does nothing: the Publisher holds no resources of its own.
func (p *Publisher) Close() error { return nil }

var _ message.Publisher = (*Publisher)(nil)
