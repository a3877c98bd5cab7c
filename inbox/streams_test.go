package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// twice publishes every call twice, as a relay does that dies after the
// transport acknowledged a batch and before its mark committed.
type twice struct{ message.Publisher }

func (p twice) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	return p.Publisher.Publish(topic, msgs...)
}

// relayToInbox runs the whole path: events written to the outbox (n over
// keys keys), a relay publishing each batch twice to pub, a Router reading
// topic with sub under the dedup middleware, a handler that fails the
// first delivery of every seventh event and otherwise writes one effect row
// (key, seq) in the middleware's transaction. It checks that every event
// took effect exactly once, although each was delivered at least twice,
// and that each key's effects were applied in commit order.
func relayToInbox(t *testing.T, topic string, pub message.Publisher, sub message.Subscriber) {
	t.Helper()
	const n, keys = 1_000, 10
	b := setup(t, 8)
	ctx := context.Background()
	ordered := b.table("ordered_effect")
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE `+ordered+` (n bigserial PRIMARY KEY, event_id uuid NOT NULL, key text NOT NULL, seq int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{Topic: topic, PartitionKey: fmt.Sprintf("key-%d", i%keys), EventType: "Counted", Payload: fmt.Appendf(nil, `{"seq":%d}`, i)}
	}
	if _, err := w.Write(ctx, events...); err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(b.db.Pool, outbox.RelayConfig{Schema: b.db.Schema, Publisher: twice{pub}})
	if err != nil {
		t.Fatal(err)
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-relayDone; err != nil {
			t.Errorf("Relay.Run: %v", err)
		}
	})

	var mu sync.Mutex
	failed := map[string]bool{}
	var deliveries, failures atomic.Int64
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	h := router.AddConsumerHandler("billing", topic, sub, func(msg *message.Message) error {
		var body struct{ Seq int }
		if err := json.Unmarshal(msg.Payload, &body); err != nil {
			return core.Permanent(err)
		}
		mu.Lock()
		fail := body.Seq%7 == 0 && !failed[msg.UUID]
		failed[msg.UUID] = true
		mu.Unlock()
		if fail {
			failures.Add(1)
			return errors.New("first try fails") // rolled back; the transport redelivers
		}
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no tx")
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO `+ordered+` (event_id, key, seq) VALUES ($1, $2, $3)`,
			msg.Metadata.Get(core.MetadataEventID), msg.Metadata.Get(core.MetadataPartitionKey), body.Seq)
		return err
	})
	counting := func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) { deliveries.Add(1); return next(m) }
	}
	h.AddMiddleware(counting, newDedup(t, b, "billing").Middleware)
	startRouter(t, router)

	effects := func() int { return b.count(t, `SELECT count(*) FROM `+ordered) }
	waitFor(t, 2*time.Minute, "an effect per event", func() bool { return effects() >= n })
	// Every copy reaches the middleware: each event twice, and once more
	// for each failed first try. A duplicate applied would show now.
	want := int64(2*n) + failures.Load()
	waitFor(t, time.Minute, "every delivery", func() bool { return deliveries.Load() >= want })
	if got := effects(); got != n {
		t.Fatalf("%d effects for %d events", got, n)
	}
	if got := b.count(t, `SELECT count(DISTINCT event_id) FROM `+ordered); got != n {
		t.Fatalf("%d distinct events took effect, want %d", got, n)
	}
	if failures.Load() == 0 {
		t.Fatal("no handler failed: the redeliveries were not tested")
	}
	// Per key, effects in commit order: seq increases with n.
	if bad := b.count(t, `SELECT count(*) FROM (SELECT seq, lag(seq) OVER (PARTITION BY key ORDER BY n) AS prev FROM `+ordered+`) s WHERE seq <= prev`); bad != 0 {
		t.Fatalf("%d effects applied before an earlier event of their key", bad)
	}
	t.Logf("%d events: %d deliveries (%d failed first tries), %d effects, each key in order", n, deliveries.Load(), failures.Load(), n)
}

// Relay to Redis Streams to the inbox: each event published twice, the
// first delivery of every seventh failing; one consumer of a consumer
// group. Exactly one effect per event, each key's in commit order.
func TestRedisStreamsRelayToInboxExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	url := streamtest.RedisURL(t)
	topic := pgtest.RandomName("millrace_test")
	relayToInbox(t, topic, streamtest.RedisPublisher(t, url), streamtest.RedisSubscriber(t, url, "billing"))
}

// Relay to NATS JetStream to the inbox: the same, through one subscriber of
// a durable consumer with MaxAckPending 1 (without Nats-Msg-Id, so the
// server keeps the duplicates and the inbox is what drops them).
func TestNATSJetStreamRelayToInboxExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	url := streamtest.NATSURL(t)
	topic := pgtest.RandomName("millrace_test")
	relayToInbox(t, topic, streamtest.NATSPublisher(t, url, false), streamtest.NATSSubscriber(t, url, pgtest.RandomName("billing")))
}
