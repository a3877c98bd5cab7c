package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
)

// ErrNoTx is wrapped by the error of a write without a transaction: WriteTx
// (or a TxPublisher) given a nil one, or a ContextPublisher's message whose
// context carries none (use core.ContextWithTx, or the inbox middleware).
var ErrNoTx = errors.New("outbox: no transaction")

// DefaultPartitionKey takes the partition key from the message metadata:
// core.MetadataPartitionKey, else core.MetadataAggregateID, else
// the message UUID. A message keyed by its UUID (a plain Watermill message,
// a CQRS event) comes with no ordering promise: each is a key of its own,
// spread over lanes and Kafka partitions, so two such messages may be
// published in either order. Set partition_key (or aggregate_id) metadata,
// or use WithPartitionKey, for messages that must stay in order.
func DefaultPartitionKey(_ string, msg *message.Message) (string, error) {
	if k := msg.Metadata.Get(core.MetadataPartitionKey); k != "" {
		return k, nil
	}
	if k := msg.Metadata.Get(core.MetadataAggregateID); k != "" {
		return k, nil
	}
	return msg.UUID, nil
}

// Publisher is a Watermill message.Publisher that writes messages to the
// outbox instead of a broker, in a PostgreSQL transaction: either a fixed
// one (TxPublisher) or the one in each message's context (ContextPublisher).
// Plain Watermill messages work, including those of Watermill's CQRS event
// bus. It is safe for concurrent use if its transaction is.
//
// Each message becomes one event: the message UUID is the event id (it must
// be a UUID; the same UUID may go to several topics, once per topic), the
// topic is the event's topic, and the metadata travels as headers,
// unchanged (metadata that cannot, such as text with NUL bytes, is refused
// with an *EventError). The partition key comes from WithPartitionKey's function
// (DefaultPartitionKey: partition_key or aggregate_id metadata, else the
// UUID, with no ordering promise). The event type is metadata event_type,
// else "name" (what Watermill's CQRS marshalers set); aggregate_type and
// aggregate_id come from metadata of those names. The payload is stored as
// JSON when content_type metadata says application/json (it must then be
// JSON), as bytes when it says application/octet-stream, and otherwise as
// JSON if it is valid JSON in UTF-8 and as bytes if not; either way it is
// delivered byte for byte.
//
// Publish writes with the message's context (Message.Context; the first
// message's, for the messages of one transaction), as Watermill's
// publishers do. Publish with no messages returns an error wrapping ErrInvalidEvent, like
// WriteTx: publishing nothing is more likely a bug than an intent.
type Publisher struct {
	w            *Writer
	tx           pgx.Tx
	bound        bool // TxPublisher: write into tx, whatever the message context says
	partitionKey func(topic string, msg *message.Message) (string, error)
}

// TxPublisher returns a Publisher that writes into tx. Use it for the
// length of tx only.
func (w *Writer) TxPublisher(tx pgx.Tx) *Publisher {
	return &Publisher{w: w, tx: tx, bound: true, partitionKey: DefaultPartitionKey}
}

// ContextPublisher returns a Publisher that writes each message into the
// transaction carried by the message's context (core.TxFromContext).
// It is long-lived: make it once and hand it to Watermill components.
func (w *Writer) ContextPublisher() *Publisher {
	return &Publisher{w: w, partitionKey: DefaultPartitionKey}
}

// WithPartitionKey returns a copy of p that picks partition keys with fn.
// A message's partition_key metadata, when set, must agree with the key fn
// picks (it travels to the consumer as it is).
func (p *Publisher) WithPartitionKey(fn func(topic string, msg *message.Message) (string, error)) *Publisher {
	c := *p
	c.partitionKey = fn
	return &c
}

// Publish writes msgs to the outbox as events on topic, in one round trip
// per transaction. It fails as a whole: nothing is written if any message is
// invalid, and an invalid message is reported (as an *EventError) before
// anything is sent, so the transaction stays usable.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return errNoEvents
	}
	events := make([]Event, len(msgs))
	for i, msg := range msgs {
		if msg.UUID == "" {
			// An empty id would be generated; a message must name its own.
			return &EventError{Index: i, Err: core.ErrInvalidEventID}
		}
		key, err := p.partitionKey(topic, msg)
		if err != nil {
			return fmt.Errorf("outbox: partition key of message %s: %w", msg.UUID, err)
		}
		md := msg.Metadata
		eventType := md.Get(core.MetadataEventType)
		if eventType == "" {
			eventType = md.Get("name")
		}
		events[i] = Event{
			ID:            msg.UUID,
			Topic:         topic,
			PartitionKey:  key,
			AggregateType: md.Get(core.MetadataAggregateType),
			AggregateID:   md.Get(core.MetadataAggregateID),
			EventType:     eventType,
			Payload:       msg.Payload,
			Binary:        storeAsBinary(md.Get(core.MetadataContentType), msg.Payload),
			Metadata:      md,
		}
	}
	if p.bound {
		_, err := p.w.WriteTx(msgs[0].Context(), p.tx, events...)
		return err
	}
	// Messages may carry different transactions; write each group in turn,
	// with the context of its first message.
	type group struct {
		ctx    context.Context
		events []Event
	}
	byTx := map[pgx.Tx]*group{}
	var order []pgx.Tx
	for i, msg := range msgs {
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return fmt.Errorf("message %s: %w in its context (use core.ContextWithTx, or the inbox middleware)", msg.UUID, ErrNoTx)
		}
		g, seen := byTx[tx]
		if !seen {
			g = &group{ctx: msg.Context()}
			byTx[tx] = g
			order = append(order, tx)
		}
		g.events = append(g.events, events[i])
	}
	for _, tx := range order {
		if _, err := p.w.WriteTx(byTx[tx].ctx, tx, byTx[tx].events...); err != nil {
			return err
		}
	}
	return nil
}

// storeAsBinary decides how a message payload is stored: as its
// content_type metadata says for millrace's two types, else as JSON when it
// is JSON.
func storeAsBinary(contentType string, payload []byte) bool {
	switch contentType {
	case core.ContentTypeBinary:
		return true
	case core.ContentTypeJSON:
		return false
	}
	return !utf8.Valid(payload) || !json.Valid(payload)
}

// Close does nothing: the Publisher holds no resources of its own.
func (p *Publisher) Close() error { return nil }

var _ message.Publisher = (*Publisher)(nil)
