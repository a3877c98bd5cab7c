package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// TestOutboxPubSubConformance runs Watermill's Pub/Sub conformance suite on
// the outbox used as a Watermill publisher: each Publish call writes its
// messages in a transaction of its own (Writer.TxPublisher) and commits; a
// relay ships them through kafka.Publisher; watermill-kafka's subscriber
// reads them. The messages are plain Watermill messages (no partition key,
// payloads that are not all JSON), so the features claimed are those the
// path really has: consumer groups and persistence, at-least-once (not
// exactly-once) delivery, and no ordering promise for unkeyed messages.
//
// It runs in short mode always (ForceShort): about 20 subtests in parallel
// over one embedded broker and one schema.
func TestOutboxPubSubConformance(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 16})
	w := newWriter(t, db)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: pub,
		PollInterval: 50 * time.Millisecond, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	// Cleanups run last in, first out: the relay stops before the broker
	// and the schema go.
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Relay.Run: %v", err)
		}
		pub.Close()
	})

	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		return &txPublishPerCall{pool: db, w: w}, kafkatest.NewGroupSubscriber(t, brokers, group)
	}
	tests.TestPubSub(t, tests.Features{
		ConsumerGroups:      true,
		ExactlyOnceDelivery: false,
		GuaranteedOrder:     false,
		Persistent:          true,
		// A subscriber without a group of its own continues its topic's
		// group (TestContinueAfterSubscribeClose needs that), so it does
		// not read again what an earlier one consumed: as watermill-kafka
		// runs the suite.
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       true,
		GenerateTopicFunc:                func(tests.TestContext) string { return kafkatest.Topic() },
	},
		func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "") },
		newPubSub,
	)
}

// txPublishPerCall is what a service does: each Publish is one business
// transaction that writes its messages to the outbox and commits.
type txPublishPerCall struct {
	pool *pgtest.DB
	w    *outbox.Writer
}

func (p *txPublishPerCall) Publish(topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	if len(msgs) > 0 {
		ctx = msgs[0].Context()
	}
	return pgx.BeginFunc(ctx, p.pool.Pool, func(tx pgx.Tx) error {
		return p.w.TxPublisher(tx).Publish(topic, msgs...)
	})
}

func (p *txPublishPerCall) Close() error { return nil }
