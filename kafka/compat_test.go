package kafka_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// Compatibility with watermill-kafka, both ways: what kafka.Publisher
// writes, watermill-kafka's Subscriber reads with its DefaultMarshaler,
// and what watermill-kafka's Publisher writes (its partitioning marshaler
// keyed by core.MetadataPartitionKey), kafka.Subscriber reads: UUID,
// payload, metadata and record key intact, each key in one partition (the
// same one either publisher picks) and in order.

// compatMessages are the messages the compatibility tests send: six keys,
// keyless ones, binary payloads with NUL and invalid UTF-8, an empty and a
// nil payload, hostile metadata bytes, no metadata at all.
func compatMessages() []*message.Message {
	var msgs []*message.Message
	for i := range 30 {
		m := message.NewMessage(fmt.Sprintf("0190c3f4-0000-7000-8000-%012d", i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		m.Metadata.Set(core.MetadataPartitionKey, "key-"+strconv.Itoa(i%6))
		m.Metadata.Set(core.MetadataEventType, "Numbered")
		msgs = append(msgs, m)
	}
	msgs[3].Payload = []byte("\x00\xff binary \xc3\x28")
	msgs[3].Metadata.Set("\xffk\x00", "\xfe\x00 value")
	msgs[4].Payload = nil
	msgs[5].Payload = []byte{}
	msgs[6].Metadata.Set("empty", "")
	delete(msgs[7].Metadata, core.MetadataPartitionKey)
	delete(msgs[13].Metadata, core.MetadataPartitionKey)
	msgs[8].Metadata = message.Metadata{}
	return msgs
}

// arrived is a message read back with its record's key and partition.
type arrived struct {
	msg       *message.Message
	key       string
	partition int32
}

// checkArrived fails t unless got holds each of sent once, intact (UUID,
// payload, metadata, the partition key as record key), and each key's
// messages in the order sent.
func checkArrived(t *testing.T, sent []*message.Message, got []arrived) {
	t.Helper()
	byUUID := map[string]*message.Message{}
	at := map[string]int{}
	for i, m := range sent {
		byUUID[m.UUID], at[m.UUID] = m, i
	}
	last := map[string]int{}
	for _, a := range got {
		want, ok := byUUID[a.msg.UUID]
		if !ok {
			t.Fatalf("message %q was not sent, or arrived twice", a.msg.UUID)
		}
		delete(byUUID, a.msg.UUID)
		if !bytes.Equal(a.msg.Payload, want.Payload) {
			t.Errorf("message %s: payload %q, want %q", want.UUID, a.msg.Payload, want.Payload)
		}
		if !maps.Equal(a.msg.Metadata, want.Metadata) {
			t.Errorf("message %s: metadata %q, want %q", want.UUID, a.msg.Metadata, want.Metadata)
		}
		key := want.Metadata.Get(core.MetadataPartitionKey)
		if a.key != key {
			t.Errorf("message %s: record key %q, want %q", want.UUID, a.key, key)
		}
		if prev, ok := last[key]; ok && prev > at[want.UUID] {
			t.Errorf("key %q: message %d arrived after %d", key, at[want.UUID], prev)
		}
		last[key] = at[want.UUID]
	}
	if len(byUUID) > 0 {
		t.Errorf("%d messages did not arrive", len(byUUID))
	}
}

// checkSamePartitions fails t unless each key of a is in one partition,
// the same as in b.
func checkSamePartitions(t *testing.T, a, b []arrived) {
	t.Helper()
	where := func(as []arrived) map[string]int32 {
		m := map[string]int32{}
		for _, x := range as {
			if p, ok := m[x.key]; ok && p != x.partition {
				t.Fatalf("key %q in partitions %d and %d", x.key, p, x.partition)
			}
			m[x.key] = x.partition
		}
		return m
	}
	pa, pb := where(a), where(b)
	if !maps.Equal(pa, pb) {
		t.Errorf("partitions by key %v, watermill-kafka's publisher put them in %v", pa, pb)
	}
	if len(slices.Compact(slices.Sorted(maps.Values(pa)))) < 2 {
		t.Errorf("every key in one partition (%v): the test does not test placement", pa)
	}
}

func copies(msgs []*message.Message) []*message.Message {
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = m.Copy()
	}
	return out
}

func newWatermillKafkaPublisher(t *testing.T, brokers []string) *wkafka.Publisher {
	t.Helper()
	pub, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers: brokers, Marshaler: kafkatest.WatermillMarshaler(), OverwriteSaramaConfig: kafkatest.SaramaConfig(),
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

// readWithWatermillKafka reads n messages of topic with watermill-kafka's
// Subscriber and its DefaultMarshaler (kafkatest.Read), with the key and
// partition watermill-kafka reports.
func readWithWatermillKafka(t *testing.T, brokers []string, topic string, n int) []arrived {
	t.Helper()
	var out []arrived
	for _, m := range kafkatest.Read(t, brokers, topic, n) {
		key, _ := wkafka.MessageKeyFromCtx(m.Context())
		part, _ := wkafka.MessagePartitionFromCtx(m.Context())
		out = append(out, arrived{msg: m, key: string(key), partition: part})
	}
	return out
}

func TestWatermillKafkaSubscriberReadsPublisher(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	ours, theirs := kafkatest.Topic(), kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, ours, 4, nil)
	kafkatest.CreateTopic(t, brokers, theirs, 4, nil)
	sent := compatMessages()
	if err := newPublisher(t, brokers).Publish(ours, copies(sent)...); err != nil {
		t.Fatal(err)
	}
	if err := newWatermillKafkaPublisher(t, brokers).Publish(theirs, copies(sent)...); err != nil {
		t.Fatal(err)
	}
	got := readWithWatermillKafka(t, brokers, ours, len(sent))
	checkArrived(t, sent, got)
	checkSamePartitions(t, got, readWithWatermillKafka(t, brokers, theirs, len(sent)))
}

func TestSubscriberReadsWatermillKafkaPublisher(t *testing.T) {
	t.Parallel()
	brokers, topic := kafkatest.Brokers(t), kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, topic, 4, nil)
	sent := compatMessages()
	if err := newWatermillKafkaPublisher(t, brokers).Publish(topic, copies(sent)...); err != nil {
		t.Fatal(err)
	}
	ch, err := newSub(t, brokers, kafkatest.Group()).Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var got []arrived
	for range sent {
		m := next(t, ch)
		r, ok := kafka.RecordFromContext(m.Context())
		if !ok || r.Timestamp.IsZero() {
			t.Fatal("no record, or no timestamp")
		}
		key, part := r.Key, r.Partition
		got = append(got, arrived{msg: m, key: string(key), partition: part})
		m.Ack()
	}
	checkArrived(t, sent, got)
}

// The record format itself, without a broker: DefaultMarshaler writes what
// watermill-kafka's partitioning marshaler writes (key, value, the same
// headers), and each side's unmarshaler reads the other's record as its
// own.
func TestDefaultMarshalerIsWatermillKafkasFormat(t *testing.T) {
	t.Parallel()
	for _, m := range compatMessages() {
		ours, err := kafka.DefaultMarshaler().Marshal("t", m)
		if err != nil {
			t.Fatal(err)
		}
		pm, err := kafkatest.WatermillMarshaler().Marshal("t", m)
		if err != nil {
			t.Fatal(err)
		}
		theirs := recordOf(t, pm)
		if !bytes.Equal(ours.Key, theirs.Key) || (ours.Key == nil) != (theirs.Key == nil) {
			t.Errorf("message %s: key %q (nil %v), watermill-kafka's %q (nil %v)", m.UUID, ours.Key, ours.Key == nil, theirs.Key, theirs.Key == nil)
		}
		if !bytes.Equal(ours.Value, theirs.Value) || (ours.Value == nil) != (theirs.Value == nil) {
			t.Errorf("message %s: value %q, watermill-kafka's %q", m.UUID, ours.Value, theirs.Value)
		}
		if h, w := headerMap(ours.Headers), headerMap(theirs.Headers); !maps.Equal(h, w) || len(ours.Headers) != len(theirs.Headers) {
			t.Errorf("message %s: headers %q, watermill-kafka's %q", m.UUID, ours.Headers, theirs.Headers)
		}
		assertSameMessage(t, m, ours)
		assertSameMessage(t, m, theirs)
	}
	if _, err := kafka.DefaultMarshaler().Marshal("t", message.NewMessage("x", nil)); err != nil {
		t.Fatal(err)
	}
	reserved := message.NewMessage("x", nil)
	reserved.Metadata.Set("_watermill_message_uuid", "y")
	if _, err := kafkatest.WatermillMarshaler().Marshal("t", reserved); err == nil {
		t.Fatal("watermill-kafka accepts the reserved key: the test's premise is wrong")
	}
	if _, err := kafka.DefaultMarshaler().Marshal("t", reserved); err == nil {
		t.Error("DefaultMarshaler accepted metadata holding the reserved UUID key")
	}
}

// assertSameMessage checks that both unmarshalers read r as m.
func assertSameMessage(t *testing.T, m *message.Message, r *kgo.Record) {
	t.Helper()
	ours, err := kafka.DefaultUnmarshaler().Unmarshal(r)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := wkafka.DefaultMarshaler{}.Unmarshal(consumerMessage(r))
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []*message.Message{ours, theirs} {
		if got.UUID != m.UUID || !bytes.Equal(got.Payload, m.Payload) || !maps.Equal(got.Metadata, m.Metadata) {
			t.Errorf("read %s %q %q, want %s %q %q", got.UUID, got.Payload, got.Metadata, m.UUID, m.Payload, m.Metadata)
		}
	}
}

// FuzzDefaultUnmarshaler: any record reads the same with DefaultUnmarshaler
// as with watermill-kafka's DefaultMarshaler.
func FuzzDefaultUnmarshaler(f *testing.F) {
	f.Add([]byte(`{"n":1}`), "_watermill_message_uuid", "id", "k", "v", false)
	f.Add([]byte("\x00\xff"), "k", "\xfe", "k", "again", true)
	f.Add([]byte(nil), "_watermill_message_uuid", "", "_watermill_message_uuid", "second", false)
	f.Fuzz(func(t *testing.T, value []byte, k1, v1, k2, v2 string, nilValue bool) {
		if nilValue {
			value = nil
		}
		r := &kgo.Record{Value: value, Headers: []kgo.RecordHeader{{Key: k1, Value: []byte(v1)}, {Key: k2, Value: []byte(v2)}}}
		ours, err := kafka.DefaultUnmarshaler().Unmarshal(r)
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := wkafka.DefaultMarshaler{}.Unmarshal(consumerMessage(r))
		if err != nil {
			t.Fatal(err)
		}
		if ours.UUID != theirs.UUID || !bytes.Equal(ours.Payload, theirs.Payload) || !maps.Equal(ours.Metadata, theirs.Metadata) {
			t.Errorf("read %s %q %q, watermill-kafka %s %q %q", ours.UUID, ours.Payload, ours.Metadata, theirs.UUID, theirs.Payload, theirs.Metadata)
		}
	})
}

// recordOf encodes sarama's producer message as the record it sends.
func recordOf(t *testing.T, pm *sarama.ProducerMessage) *kgo.Record {
	t.Helper()
	r := &kgo.Record{Topic: pm.Topic}
	var err error
	if pm.Key != nil {
		if r.Key, err = pm.Key.Encode(); err != nil {
			t.Fatal(err)
		}
	}
	if pm.Value != nil {
		if r.Value, err = pm.Value.Encode(); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range pm.Headers {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: string(h.Key), Value: h.Value})
	}
	return r
}

// consumerMessage is the record as sarama's consumer hands it to
// watermill-kafka.
func consumerMessage(r *kgo.Record) *sarama.ConsumerMessage {
	cm := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
	for _, h := range r.Headers {
		cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return cm
}

func headerMap(hs []kgo.RecordHeader) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}
