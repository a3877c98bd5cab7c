package kafka_test

import (
	"crypto/sha1"
	"encoding/hex"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// TestSubscriberPubSubConformance runs Watermill's conformance suite on
// kafka.Subscriber, with kafka.Publisher writing, on the tier's brokers.
// The features are what the Subscriber guarantees: consumer groups,
// persistence, order per partition with one subscriber at a time (a
// partition that moves to another member is read again from its committed
// offset, so a run of messages may come twice), at-least-once delivery.
// The embedded tier runs the suite whole; the real-Kafka tier with
// ForceShort (its short message counts): the long counts publish 10,000
// messages one Publish call at a time, three minutes against the cluster.
func TestSubscriberPubSubConformance(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	run := kafkatest.Group()
	features := tests.Features{
		ConsumerGroups:                      true,
		ExactlyOnceDelivery:                 false,
		GuaranteedOrder:                     true,
		GuaranteedOrderWithSingleSubscriber: true,
		Persistent:                          true,
		RestartServiceCommand:               nil, // broker restarts are tested elsewhere
		ForceShort:                          kafkatest.Real(),
	}
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
		if err != nil {
			t.Fatal(err)
		}
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:         brokers,
			ConsumerGroup:   group,
			NackResendSleep: 10 * time.Millisecond,
			SessionTimeout:  10 * time.Second,
			RevokeGrace:     2 * time.Second,
		}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		// Some of the suite's tests leave their subscribers open.
		t.Cleanup(func() { _ = sub.Close(); _ = pub.Close() })
		return pub, sub
	}
	// The subscribers a test makes share a group (the test's own): the
	// suite's "multiplied" subscriber expects them to split the messages.
	plain := func(t *testing.T) (message.Publisher, message.Subscriber) {
		h := sha1.Sum([]byte(t.Name()))
		return withGroup(t, run+"-"+hex.EncodeToString(h[:6]))
	}
	tests.TestPubSub(t, features, plain, withGroup)
}
