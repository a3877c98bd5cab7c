package kafka_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// TestPublisherPubSubConformance runs Watermill's Pub/Sub conformance suite
// on kafka.Publisher, with watermill-kafka's subscriber reading what it
// writes (kafkatest.GroupSubscriber, topics of four partitions), twice:
//
//   - unkeyed: plain Watermill messages, as any Watermill user sends them.
//     The Publisher spreads records without a key over the partitions, so
//     no order is claimed.
//   - keyed: each message carries core.MetadataPartitionKey (its
//     payload, which is what the suite's order test groups by). A key's
//     records go to one partition, in order: order is claimed, as Kafka
//     gives it, per partition.
//
// Both claim consumer groups and persistence, and at-least-once rather
// than exactly-once delivery. They run in short mode always (ForceShort):
// the suite's long counts and its stress run would take minutes on two
// cores.
func TestPublisherPubSubConformance(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	for _, keyed := range []bool{false, true} {
		name := "unkeyed"
		if keyed {
			name = "keyed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
				p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
				if err != nil {
					t.Fatal(err)
				}
				var pub message.Publisher = p
				if keyed {
					pub = keyedByPayload{p}
				}
				return pub, kafkatest.NewGroupSubscriber(t, brokers, group)
			}
			tests.TestPubSub(t, tests.Features{
				ConsumerGroups:      true,
				ExactlyOnceDelivery: false,
				GuaranteedOrder:     keyed,
				Persistent:          true,
				// A subscriber without a group of its own continues its
				// topic's group (TestContinueAfterSubscribeClose needs
				// that), so it does not read again what an earlier one
				// consumed: as watermill-kafka runs the suite.
				NewSubscriberReceivesOldMessages: false,
				ForceShort:                       true,
				GenerateTopicFunc:                func(tests.TestContext) string { return kafkatest.Topic() },
			},
				func(t *testing.T) (message.Publisher, message.Subscriber) { return newPubSub(t, "") },
				newPubSub,
			)
		})
	}
}

// keyedByPayload gives each message its payload as partition key, then
// publishes it with the Publisher.
type keyedByPayload struct{ *kafka.Publisher }

func (p keyedByPayload) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		m.Metadata.Set(core.MetadataPartitionKey, string(m.Payload))
	}
	return p.Publisher.Publish(topic, msgs...)
}
