package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
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
		return &txPublishPerCall{pool: db, w: w}, &groupSubscriber{t: t, brokers: brokers, group: group}
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

// groupSubscriber is watermill-kafka's subscriber in a consumer group: the
// given one, or else one per topic, the same for every subscriber of the
// suite, so that a subscriber made later continues where an earlier one
// stopped (what the suite expects of a subscriber without a group) without
// every test of the suite rebalancing one shared group.
type groupSubscriber struct {
	t       *testing.T
	brokers []string
	group   string

	mu   sync.Mutex
	subs []*wkafka.Subscriber
}

func (s *groupSubscriber) subscriber(topic string) (*wkafka.Subscriber, error) {
	group := s.group
	if group == "" {
		group = "cg_" + topic
	}
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               s.brokers,
		Unmarshaler:           kafka.DefaultMarshaler(),
		OverwriteSaramaConfig: kafka.DefaultSaramaSubscriberConfig(),
		ConsumerGroup:         group,
		// SubscribeInitialize creates the topic with several partitions,
		// so that unkeyed messages really spread.
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1},
	}, nil)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return sub, nil
}

func (s *groupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.subscriber(topic)
	if err != nil {
		return nil, err
	}
	return sub.Subscribe(ctx, topic)
}

func (s *groupSubscriber) SubscribeInitialize(topic string) error {
	sub, err := s.subscriber(topic)
	if err != nil {
		return err
	}
	return sub.SubscribeInitialize(topic)
}

func (s *groupSubscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for _, sub := range s.subs {
		if err := sub.Close(); err != nil && first == nil {
			first = err
		}
	}
	s.subs = nil
	return first
}
