package inbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
)

// defaultPartitionKey returns metadata core.MetadataPartitionKey, else
// core.MetadataAggregateID, else "" (no order).
func defaultPartitionKey(msg *message.Message) string {
	if k := msg.Metadata.Get(core.MetadataPartitionKey); k != "" {
		return k
	}
	return msg.Metadata.Get(core.MetadataAggregateID)
}

// ReceiverConfig configures a Receiver.
type ReceiverConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the inbox; a Processor with the same name applies
	// what this Receiver stores. Required.
	Consumer string
	// EventID returns a message's event id, which must be a UUID.
	// Defaults to DefaultEventID: metadata "event_id", else the message UUID.
	EventID func(msg *message.Message) (string, error)
	// PartitionKey picks the partition key of a received message: rows
	// with the same non-empty key are processed in arrival order when the
	// Processor's OrderByKey is set. Defaults to the metadata
	// partition_key, else aggregate_id, else "" (no order).
	PartitionKey func(msg *message.Message) string
}

// Receiver stores messages in the inbox (inbox_event) for a Processor to
// apply later: store now, process at your own pace. A message already
// stored (same consumer and event id) is ignored, so redeliveries are
// harmless. It is safe for concurrent use.
type Receiver struct {
	pool         *pgxpool.Pool
	consumer     string
	eventID      func(*message.Message) (string, error)
	partitionKey func(*message.Message) string
	insert       string
}

// NewReceiver returns a Receiver. pool is used by Handle and Receive; it
// may be nil if you only call ReceiveTx.
func NewReceiver(pool *pgxpool.Pool, cfg ReceiverConfig) (*Receiver, error) {
	schema, err := configSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := checkConsumer("ReceiverConfig.Consumer", cfg.Consumer); err != nil {
		return nil, err
	}
	if cfg.EventID == nil {
		cfg.EventID = DefaultEventID
	}
	if cfg.PartitionKey == nil {
		cfg.PartitionKey = defaultPartitionKey
	}
	return &Receiver{
		pool:         pool,
		consumer:     cfg.Consumer,
		eventID:      cfg.EventID,
		partitionKey: cfg.PartitionKey,
		// One statement for the whole batch; duplicates hit the unique
		// constraint (consumer, event_id) and are skipped.
		insert: fmt.Sprintf(`INSERT INTO %s (consumer, event_id, topic, partition_key, payload, metadata)
SELECT $1, * FROM unnest($2::uuid[], $3::text[], $4::text[], $5::bytea[], $6::text[]::jsonb[])
ON CONFLICT (consumer, event_id) DO NOTHING`, sqlident.Table(schema, "inbox_event")),
	}, nil
}

// Handle stores one message and returns, so the broker is acknowledged as
// soon as the row is committed. It is a Watermill
// message.NoPublishHandlerFunc: router.AddConsumerHandler(name, topic, sub,
// receiver.Handle). A message without a usable event id fails with
// ErrNoEventID (permanent), for the PoisonQueue middleware.
func (r *Receiver) Handle(msg *message.Message) error {
	_, err := r.Receive(msg.Context(), msg)
	return err
}

// Receive stores msgs in one transaction of its own, in one round trip,
// and returns how many were new (the others were stored before).
func (r *Receiver) Receive(ctx context.Context, msgs ...*message.Message) (int, error) {
	if r.pool == nil {
		return 0, fmt.Errorf("%w: Receive needs a Receiver made with a pool; use ReceiveTx", core.ErrConfig)
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	args, err := r.args(msgs)
	if err != nil {
		return 0, err
	}
	// A single statement commits on its own: no BEGIN/COMMIT round trips.
	tag, err := r.pool.Exec(ctx, r.insert, args...)
	if err != nil {
		return 0, fmt.Errorf("inbox: receive %d message(s): %w", len(msgs), err)
	}
	return int(tag.RowsAffected()), nil
}

// ReceiveTx is Receive in the caller's transaction: the messages become
// visible to processors when tx commits.
func (r *Receiver) ReceiveTx(ctx context.Context, tx pgx.Tx, msgs ...*message.Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	args, err := r.args(msgs)
	if err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, r.insert, args...)
	if err != nil {
		return 0, fmt.Errorf("inbox: receive %d message(s): %w", len(msgs), err)
	}
	return int(tag.RowsAffected()), nil
}

// args validates every message before anything is written: one message
// without an id, or with text the inbox cannot store unchanged, fails the
// call (permanently) and leaves a caller's transaction as it was.
func (r *Receiver) args(msgs []*message.Message) ([]any, error) {
	n := len(msgs)
	ids := make([][16]byte, n) // as in Deduplicator.eventIDs
	topics := make([]string, n)
	keys := make([]string, n)
	payloads := make([][]byte, n)
	metas := make([]string, n)
	for i, msg := range msgs {
		id, err := eventID(r.eventID, msg)
		if err != nil {
			return nil, err
		}
		ids[i] = id
		topics[i] = message.SubscribeTopicFromCtx(msg.Context())
		keys[i] = r.partitionKey(msg)
		if err := checkStorable(msg, topics[i], keys[i]); err != nil {
			return nil, err
		}
		payloads[i] = msg.Payload
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		metas[i] = "{}"
		if len(msg.Metadata) > 0 {
			b, err := json.Marshal(msg.Metadata)
			if err != nil {
				return nil, core.Permanent(fmt.Errorf("inbox: message %q: metadata: %w", msg.UUID, err))
			}
			metas[i] = string(b)
		}
	}
	return []any{r.consumer, ids, topics, keys, payloads, metas}, nil
}
