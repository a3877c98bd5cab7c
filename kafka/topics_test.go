package kafka_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// failures returns the errors of a BatchError by message UUID (nil for
// nil), failing t for any other error.
func failures(t *testing.T, err error) map[string]error {
	t.Helper()
	out := map[string]error{}
	if err == nil {
		return out
	}
	var be *core.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("error %v, want a *core.BatchError", err)
	}
	for _, me := range be.Errors {
		out[me.UUID] = me.Err
	}
	return out
}

// numbered returns n messages numbered from first, over keys.
func numbered(first, n, keys int) []*message.Message {
	var msgs []*message.Message
	for i := range n {
		msgs = append(msgs, newMessage(first+i, "k"+strconv.Itoa(i%keys)))
	}
	return msgs
}

// A topic that does not exist (and that the cluster does not create)
// fails its own messages only, in a call with another topic, and does not
// stall it: the other topic's messages are delivered. Its messages fail
// as the topic's fault, not permanently (an operator may create it) and
// not as an outage (the relay charges them, and dead-letters them after
// its MaxAttempts); the next call fails them at once, without waiting for
// the cluster again. (PublishTopics once cancelled the whole round when
// the missing topic's records failed, failing every other topic's.)
func TestPublishTopicsMissingTopicFailsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{NoAutoCreate: true})
	good, missing := kafkatest.Topic(), kafkatest.Topic()
	kafkatest.CreateTopic(t, b.Addrs(), good, 3, nil)
	p := newPublisher(t, b.Addrs())
	for round := range 2 {
		ok, lost := numbered(round*100, 5, 5), numbered(round*100+50, 2, 2)
		start := time.Now()
		failed := failures(t, p.PublishTopics(map[string][]*message.Message{good: ok, missing: lost}))
		took := time.Since(start)
		for _, m := range ok {
			if err := failed[m.UUID]; err != nil {
				t.Fatalf("round %d: message %s of the existing topic failed: %v", round, m.UUID, err)
			}
		}
		for _, m := range lost {
			err := failed[m.UUID]
			if !errors.Is(err, kerr.UnknownTopicOrPartition) || core.IsPermanent(err) || kafka.IsTemporary(err) {
				t.Fatalf("round %d: message %s of the missing topic: %v; want UNKNOWN_TOPIC_OR_PARTITION, neither permanent nor temporary", round, m.UUID, err)
			}
		}
		if round == 1 && took > 2*time.Second {
			t.Fatalf("the second call took %v: the missing topic was waited for again", took)
		}
	}
	if n := kafkatest.RecordCount(t, b.Addrs(), good); n != 10 {
		t.Fatalf("the existing topic holds %d records, want 10", n)
	}
}

// A topic name Kafka refuses (a space in it; one of 300 characters) fails
// its own messages, permanently, and no other topic's: a call that holds
// it with a valid topic delivers the valid topic's messages. (The failure
// of the refused topic's first record once cancelled the round, and every
// other record failed with "unable to initialize a producer ID ...:
// context canceled".)
func TestPublishTopicsInvalidTopicFailsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	for _, bad := range []string{"bad topic", strings.Repeat("t", 300)} {
		good := kafkatest.Topic()
		p := newPublisher(t, brokers)
		ok, refused := numbered(0, 5, 5), numbered(50, 2, 2)
		failed := failures(t, p.PublishTopics(map[string][]*message.Message{good: ok, bad: refused}))
		for _, m := range ok {
			if err := failed[m.UUID]; err != nil {
				t.Fatalf("topic %.20q: message %s of the valid topic failed: %v", bad, m.UUID, err)
			}
		}
		for _, m := range refused {
			if err := failed[m.UUID]; !core.IsPermanent(err) {
				t.Fatalf("topic %.20q: message %s: %v, want a permanent failure", bad, m.UUID, err)
			}
		}
		if n := kafkatest.RecordCount(t, brokers, good); n != 5 {
			t.Fatalf("the valid topic holds %d records, want 5", n)
		}
	}
}

// Two topics whose limits are lowered while the Publisher runs, so that
// the broker refuses their batches for size: each record is judged by its
// own topic's limit. Records that fit their topic alone are sent again
// alone and delivered, none is reported too large. (The refusal was once
// judged by the limit of the round's first topic: the second topic's
// records, larger than that limit but within their own, were reported
// permanently too large.)
func TestPublishTopicsJudgesSizeByEachRecordsTopic(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	first, second := "a-"+kafkatest.Topic(), "b-"+kafkatest.Topic() // in this order in the call
	kafkatest.CreateTopic(t, brokers, first, 1, nil)
	kafkatest.CreateTopic(t, brokers, second, 1, nil)
	p := newPublisher(t, brokers)
	warm := map[string][]*message.Message{first: {newMessage(0, "w")}, second: {newMessage(1, "w")}}
	if err := p.PublishTopics(warm); err != nil {
		t.Fatal(err)
	}
	kafkatest.SetTopicConfig(t, brokers, first, "max.message.bytes", "100000")
	kafkatest.SetTopicConfig(t, brokers, second, "max.message.bytes", "500000")
	small, large := numbered(10, 4, 4), numbered(20, 4, 4)
	for _, m := range small {
		m.Payload = []byte(`"` + strings.Repeat("s", 40_000) + `"`)
	}
	for _, m := range large {
		m.Payload = []byte(`"` + strings.Repeat("l", 200_000) + `"`)
	}
	if err := p.PublishTopics(map[string][]*message.Message{first: small, second: large}); err != nil {
		t.Fatalf("PublishTopics: %v; want every record delivered (each fits its own topic)", err)
	}
	if n := kafkatest.RecordCount(t, brokers, second); n != 5 {
		t.Fatalf("the second topic holds %d records, want 5", n)
	}
}

// A topic's limit raised while the Publisher runs: a record over the old
// limit and within the new one is delivered, not refused by the old limit
// (the Publisher reads the limit again when a record does not fit it).
func TestPublishTopicLimitRaisedWhileRunning(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, topic, 1, map[string]string{"max.message.bytes": "100000"})
	p := newPublisher(t, brokers)
	if err := p.Publish(topic, newMessage(0, "k")); err != nil {
		t.Fatal(err)
	}
	kafkatest.SetTopicConfig(t, brokers, topic, "max.message.bytes", "500000")
	big := newMessage(1, "k")
	big.Payload = []byte(`"` + strings.Repeat("x", 300_000) + `"`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		// A broker may answer with the old value for a moment after the
		// change: the record fails permanently then, and the test tries
		// again, as an operator would requeue it.
		err := p.Publish(topic, big, newMessage(2, "k"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish after the limit was raised: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n < 3 {
		t.Fatalf("topic holds %d records, want 3", n)
	}
}

// A topic created (with a limit below MaxMessageBytes) after the Publisher
// first tried it: once it exists its records go out in batches the
// topic takes, without a refusal by the broker (the client is told the
// topic's limit). (Once the Publisher had guessed MaxMessageBytes for a
// topic it could not describe, its client kept batches of that size for
// good: every call was refused, and sent again record by record.)
func TestPublishTopicCreatedAfterFirstTry(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{NoAutoCreate: true})
	topic := kafkatest.Topic()
	logs := watermill.NewCaptureLogger()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.Addrs()}, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.Publish(topic, newMessage(0, "k")); err == nil {
		t.Fatal("Publish to a topic that does not exist succeeded")
	}
	kafkatest.CreateTopic(t, b.Addrs(), topic, 1, map[string]string{"max.message.bytes": "100000"})
	msgs := numbered(1, 12, 1) // one key: one partition, batches of several records
	for _, m := range msgs {
		m.Payload = []byte(`"` + strings.Repeat("x", 30_000) + `"`)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := p.Publish(topic, msgs...)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Publish after the topic was created: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for range 3 {
		if err := p.Publish(topic, numberedLarge(100, 12)...); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range logs.Captured()[watermill.InfoLogLevel] {
		if strings.HasPrefix(m.Msg, "Kafka batch refused by the broker") {
			t.Fatalf("a batch was refused by the broker for size once the topic existed: %s %v", m.Msg, m.Fields)
		}
	}
}

// numberedLarge returns n messages of one key, 30 kB each.
func numberedLarge(first, n int) []*message.Message {
	msgs := numbered(first, n, 1)
	for _, m := range msgs {
		m.Payload = []byte(`"` + strings.Repeat("x", 30_000) + `"`)
	}
	return msgs
}
