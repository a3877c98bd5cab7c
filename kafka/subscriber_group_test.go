package kafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
)

// A subscription to a topic just created is consumed even when some
// brokers have not heard of the topic yet. The subscriptions of one
// Subscriber are members of one group, each with its own topic, so the
// group's leader asks a broker for the partitions of topics it does not
// consume itself; a broker that did not know the new topic yet made the
// leader assign it to no member, and the group was not balanced again
// until its membership changed: the topic was never consumed. (Seen on
// the three-node cluster: a Service's reply topic and its participant's
// command topic, both new, and a saga that never completed.) Here two of
// three brokers leave a new topic out of their metadata for its first two
// seconds; each new subscription must still get its message.
func TestSubscriptionToANewTopicIsConsumedWhileBrokersLearnOfIt(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{Brokers: 3})
	group := kafkatest.Group()
	s := newSub(t, b.Addrs(), group)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A member that has its topic already: it leads the group's balances.
	first := kafkatest.Topic()
	kafkatest.CreateTopic(t, b.Addrs(), first, 8, nil)
	msgs, err := s.Subscribe(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	publishSeq(t, b.Addrs(), first, 1, func(int) string { return "k" })
	next(t, msgs).Ack()

	pub := newPublisher(t, b.Addrs())
	for range 4 {
		topic := kafkatest.Topic()
		kafkatest.CreateTopic(t, b.Addrs(), topic, 8, nil)
		// Brokers 1 and 2 have not heard of it for two seconds.
		unknown := b.Cluster().Fault(kfake.Fault{
			Keys: []kmsg.Key{kmsg.Metadata}, Nodes: []int32{1, 2}, Topic: topic,
			Err: kerr.UnknownTopicOrPartition, Count: -1,
		})
		time.AfterFunc(2*time.Second, unknown.Remove)
		msgs, err := s.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		m := newMessage(0, "k")
		// The publisher may meet a broker that does not know the topic
		// yet too: it fails the message, and a relay would try again.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			err := pub.Publish(topic, m)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		select {
		case got := <-msgs:
			if got == nil || got.UUID != m.UUID {
				t.Fatalf("topic %s: got %v, want message %s", topic, got, m.UUID)
			}
			got.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("topic %s, new while two of three brokers did not know it: its message was not delivered within 30 s (its member was assigned no partition)", topic)
		}
	}
}
