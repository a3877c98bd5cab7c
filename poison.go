package millrace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
)

// newPoisonPublisher returns a Watermill Publisher for poisoned messages that
// writes each message to the outbox with w, in a transaction of its own on
// pool, and returns once that committed; the relay then ships it to the
// broker like any event. It is where a Service poisons the messages its
// consumers can never handle.
//
// A poisoned message is one that could not be handled, so it may be
// anything: its event id is derived from its topic and its UUID (a UUID of
// version 5, so a message poisoned twice, after a redelivery, is written
// once and the second write is taken as done), its own UUID is kept in
// metadata core.MetadataPoisonedID, text that PostgreSQL cannot store (NUL,
// invalid UTF-8) in its metadata is replaced with U+FFFD, and a payload
// that is not JSON is stored as bytes (and a content_type metadata that
// said JSON then says bytes). Its partition key is its
// partition_key metadata, else its aggregate_id, else its UUID. It is safe
// for concurrent use.
func newPoisonPublisher(pool *pgxpool.Pool, w *outbox.Writer) message.Publisher {
	return &poisonPublisher{pool: pool, w: w}
}

type poisonPublisher struct {
	pool *pgxpool.Pool
	w    *outbox.Writer
}

// poisonNamespace is the UUID namespace of poisoned messages' event ids.
var poisonNamespace = uuid.MustParse("2b9c3c8e-6f0e-4c1b-9a55-7d3f5e1a0c42")

func (p *poisonPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		ev := poisonEvent(topic, msg)
		// The handler's context may be ending (the service stops): the
		// write is short and must not be cut off halfway.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(msg.Context()), 30*time.Second)
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			_, err := p.w.WriteTx(ctx, tx, ev)
			return err
		})
		cancel()
		if errors.Is(err, outbox.ErrDuplicateEvent) {
			continue // poisoned before, and not acknowledged then
		}
		if err != nil {
			return fmt.Errorf("service: poison message %s to %s: %w", clean(msg.UUID), topic, err)
		}
	}
	return nil
}

func (p *poisonPublisher) Close() error { return nil }

// poisonEvent is the outbox event of msg poisoned to topic.
func poisonEvent(topic string, msg *message.Message) outbox.Event {
	id := uuid.NewSHA1(poisonNamespace, []byte(topic+"\x00"+msg.UUID)).String()
	md := make(map[string]string, len(msg.Metadata)+2)
	for k, v := range msg.Metadata {
		if k = clean(k); k != "" {
			md[k] = clean(v)
		}
	}
	md[core.MetadataPoisonedID] = clean(msg.UUID)
	key := firstKey(md[core.MetadataPartitionKey], md[core.MetadataAggregateID], md[core.MetadataPoisonedID], id)
	ct := md[core.MetadataContentType]
	binary := ct == core.ContentTypeBinary || !utf8.Valid(msg.Payload) || !json.Valid(msg.Payload)
	// The millrace keys must agree with the event's own fields (the relay
	// sets them so).
	md[core.MetadataEventID] = id
	md[core.MetadataPartitionKey] = key
	if ct == core.ContentTypeJSON && binary {
		md[core.MetadataContentType] = core.ContentTypeBinary // it said JSON, and is not
	}
	return outbox.Event{
		ID:            id,
		Topic:         topic,
		PartitionKey:  key,
		EventType:     md[core.MetadataEventType],
		AggregateType: md[core.MetadataAggregateType],
		AggregateID:   md[core.MetadataAggregateID],
		Payload:       msg.Payload,
		Binary:        binary,
		Metadata:      md,
	}
}

// firstKey returns the first of keys that is a usable partition key.
func firstKey(keys ...string) string {
	for _, k := range keys {
		if k != "" && len(k) <= outbox.MaxKeyBytes {
			return k
		}
	}
	return keys[len(keys)-1]
}

// clean makes s storable in a text column: valid UTF-8 without NUL.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
