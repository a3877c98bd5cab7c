// Package kafkatest gives tests a Kafka to talk to over TCP: the cluster in
// KAFKA_BROKERS when set, otherwise an embedded kfake broker per test.
package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/pgtest"
)

// Brokers returns broker addresses for the test: KAFKA_BROKERS when set,
// otherwise a fresh embedded broker that is closed when the test ends.
func Brokers(t testing.TB) []string {
	t.Helper()
	if b := devkafka.EnvBrokers(); b != nil {
		return b
	}
	b := Embedded(t, devkafka.Config{})
	return b.Addrs()
}

// Embedded starts an embedded broker for the test, for tests that stop and
// restart the broker or inject faults through kfake's request hooks. In the
// real-Kafka tier (KAFKA_BROKERS set) such a test is skipped, saying so: it
// is kfake-only, and the embedded tier runs it.
func Embedded(t testing.TB, cfg devkafka.Config) *devkafka.Broker {
	t.Helper()
	if Real() {
		t.Skip("kfake-only (restarts the embedded broker or injects faults through its request hooks): the embedded tier runs it")
	}
	b, err := devkafka.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// Restartable starts an embedded broker that keeps its records in a
// directory of the test's, for tests that stop it (Close) mid-run. restart
// starts it again on the same port and directory, with the records it held,
// and closes that one too when the test ends.
func Restartable(t testing.TB) (b *devkafka.Broker, restart func() *devkafka.Broker) {
	t.Helper()
	dir := t.TempDir()
	b = Embedded(t, devkafka.Config{DataDir: dir})
	port := b.Port()
	return b, func() *devkafka.Broker {
		t.Helper()
		return Embedded(t, devkafka.Config{Port: port, DataDir: dir})
	}
}

// Real reports whether tests run against a real cluster (KAFKA_BROKERS set).
func Real() bool { return devkafka.EnvBrokers() != nil }

// Topic returns a topic name no other test uses.
func Topic() string { return pgtest.RandomName("topic") }

// Group returns a consumer-group name no other test uses.
func Group() string { return pgtest.RandomName("group") }

// SaramaConfig returns sarama producer settings for a real Kafka cluster,
// for the producers that tests and the bench's baselines run beside
// kafka.Publisher (watermill-kafka's Publisher, sarama's SyncProducer):
// protocol version 3.6, an idempotent producer (acks=all, one in-flight
// request per connection, retries on), producer successes and errors
// returned, sarama's hash partitioner (kafka.Publisher places keys as it
// does) and a 10-second dial timeout. The result is the caller's to change.
func SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "millrace"
	c.Net.DialTimeout = 10 * time.Second
	c.Net.MaxOpenRequests = 1
	c.Metadata.AllowAutoTopicCreation = true
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewHashPartitioner
	c.Producer.Compression = sarama.CompressionNone
	c.Producer.Flush.Frequency = 0
	c.Producer.Flush.MaxMessages = 0
	return c
}

// SaramaSubscriberConfig returns consumer settings for reading what
// kafka.Publisher writes with watermill-kafka's subscriber: protocol
// version 3.6 (sarama's consumer groups need one the brokers speak) and
// reading from the oldest offset when a group has none.
func SaramaSubscriberConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "millrace"
	c.Net.DialTimeout = 10 * time.Second
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}

// WatermillMarshaler returns watermill-kafka's partitioning marshaler keyed
// by core.MetadataPartitionKey: a watermill-kafka Publisher with it writes
// the records kafka.Publisher writes with kafka.DefaultMarshaler (the bench's
// baselines and the compatibility tests use it).
func WatermillMarshaler() wkafka.MarshalerUnmarshaler {
	return wkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
		return m.Metadata.Get(core.MetadataPartitionKey), nil
	})
}

// NewSubscriber returns a watermill-kafka Subscriber in a consumer group no
// other test uses, reading what kafka.Publisher writes with watermill-kafka's
// own DefaultMarshaler (SaramaSubscriberConfig: from the oldest offset). It
// is closed when the test ends; closing it earlier is fine, Close is
// idempotent.
func NewSubscriber(t testing.TB, brokers []string) *wkafka.Subscriber {
	t.Helper()
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: SaramaSubscriberConfig(),
		ConsumerGroup:         Group(),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
	})
	return sub
}

// Read subscribes to topic with NewSubscriber and returns the first n
// messages that arrive, in arrival order, acking each. It fails the test if
// they do not all arrive within a minute.
func Read(t testing.TB, brokers []string, topic string, n int) []*message.Message {
	t.Helper()
	sub := NewSubscriber(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*message.Message, 0, n)
	for len(out) < n {
		select {
		case m, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed after %d of %d messages", len(out), n)
			}
			out = append(out, m)
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("read %d of %d messages before the deadline", len(out), n)
		}
	}
	return out
}

// RecordCount returns the number of records in topic: the sum of its
// partitions' high-water marks.
func RecordCount(t testing.TB, brokers []string, topic string) int64 {
	t.Helper()
	c, err := sarama.NewClient(brokers, SaramaSubscriberConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	parts, err := c.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range parts {
		off, err := c.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		n += off
	}
	return n
}

// FailProduce makes the broker answer produce requests with an error
// instead of storing their batches, whenever fail says so: fail gets the
// node the request reached and returns the error code for every partition
// of the request (kerr codes), or 0 to let the broker store it as usual.
// It stays in force until the broker closes; fail is called from the
// broker's goroutines.
func FailProduce(b *devkafka.Broker, fail func(node int32) int16) {
	c := b.Cluster()
	c.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		code := fail(c.CurrentNode())
		if code == 0 {
			return nil, nil, false
		}
		req := kreq.(*kmsg.ProduceRequest)
		resp := req.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode, sp.BaseOffset = rp.Partition, code, -1
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// ProduceAt writes one record to partition p of topic for each time in at,
// stamped with it (as if written then), in order.
func ProduceAt(t testing.TB, brokers []string, topic string, p int32, at ...time.Time) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, ts := range at {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Partition: p, Value: []byte("v"), Timestamp: ts}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// CommitOffset commits offset at of topic's partition p for group, as a
// member of the group would after consuming the records before it.
func CommitOffset(t testing.TB, brokers []string, group, topic string, p int32, at int64) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1})
	if err := kadm.NewClient(cl).CommitAllOffsets(context.Background(), group, offs); err != nil {
		t.Fatal(err)
	}
}
