package kafka_test

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// produceCounter counts the produce requests a client writes.
type produceCounter struct{ n atomic.Int64 }

func (c *produceCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil { // Produce
		c.n.Add(1)
	}
}

// PublishTopics sends several topics' messages in one round: one produce
// request per broker, where a Publish call per topic is a round each. A
// key is one per topic: a record of key k refused in one topic holds back
// the later messages of k in that topic only. Everything else is stored,
// each key's records in order.
func TestPublishTopicsOneRoundKeysPerTopic(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	limited, other, many := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, limited, -1, map[string]string{"max.message.bytes": "700000"})
	kafkatest.CreateTopic(t, brokers, other, -1, nil)
	kafkatest.CreateTopic(t, brokers, many, -1, nil)
	produces := &produceCounter{}
	p := newPublisher(t, brokers, kgo.WithHooks(produces))

	// A first call learns the topics' partitions and limits.
	warm := map[string][]*message.Message{limited: {newMessage(0, "w")}, other: {newMessage(1, "w")}, many: {newMessage(2, "w")}}
	if err := p.PublishTopics(warm); err != nil {
		t.Fatal(err)
	}
	before := produces.n.Load()
	calm := map[string][]*message.Message{limited: {newMessage(3, "a")}, other: {newMessage(4, "a")}, many: {newMessage(5, "a")}}
	if err := p.PublishTopics(calm); err != nil {
		t.Fatal(err)
	}
	if n := produces.n.Load() - before; n < 1 || n > int64(len(brokers)) {
		t.Fatalf("a call for three topics wrote %d produce requests; want one round, at most one per broker (%d)", n, len(brokers))
	}

	k1, k2 := newMessage(100, "k"), newMessage(101, "k")
	k1.Payload = []byte(`"` + strings.Repeat("x", 800_000) + `"`)
	byTopic := map[string][]*message.Message{
		limited: {newMessage(10, "x"), k1, newMessage(11, "x"), k2, newMessage(12, "x")},
		other:   {newMessage(20, "k"), newMessage(21, "k")},
	}
	for i := range 30 {
		byTopic[many] = append(byTopic[many], newMessage(30+i, string(rune('a'+i%5))))
	}
	err := p.PublishTopics(byTopic)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 2 {
		t.Fatalf("PublishTopics: %v, want a BatchError naming the two messages of key k in %s", err, limited)
	}
	if be.Errors[0].UUID != k1.UUID || !errors.Is(be.Errors[0].Err, kafka.ErrMessageTooLarge) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("first failure %s: %v, want %s with a permanent ErrMessageTooLarge", be.Errors[0].UUID, be.Errors[0].Err, k1.UUID)
	}
	if me := be.Errors[1]; me.UUID != k2.UUID || !errors.Is(me.Err, kafka.ErrHeldBack) || !kafka.IsTemporary(me.Err) {
		t.Fatalf("second failure %s: %v, want %s held back, temporary", me.UUID, me.Err, k2.UUID)
	}
	for topic, want := range map[string]int{limited: 5, other: 4, many: 32} {
		got := readBack(t, brokers, topic, want)
		last := map[string]string{}
		for _, r := range got {
			if r.key == "k" && topic == limited {
				t.Fatalf("message %s of key k was stored in %s", r.msg.UUID, limited)
			}
			if prev, ok := last[r.key]; ok && prev >= r.msg.UUID {
				t.Fatalf("%s: key %s: %s after %s", topic, r.key, r.msg.UUID, prev)
			}
			last[r.key] = r.msg.UUID
		}
		if n := kafkatest.RecordCount(t, brokers, topic); n != int64(want) {
			t.Fatalf("%s holds %d records, want %d", topic, n, want)
		}
	}
}
