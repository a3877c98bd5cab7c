package kafka_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// orderChecker knows the order in which each key's messages were meant to
// be stored and checks what a topic holds against it: walking the topic, the
// first copy of each message must be the next one of its key. A duplicate
// (the copy of a message already seen) is allowed; a message stored before
// an earlier one of its key that was not stored yet is not.
type orderChecker struct {
	keyOf map[string]string   // message UUID → key
	order map[string][]string // key → message UUIDs in intended order
}

func newOrderChecker() *orderChecker {
	return &orderChecker{keyOf: map[string]string{}, order: map[string][]string{}}
}

func (c *orderChecker) add(m *message.Message) {
	key := m.Metadata.Get(core.MetadataPartitionKey)
	c.keyOf[m.UUID] = key
	c.order[key] = append(c.order[key], m.UUID)
}

// check reads every record of topic and fails the test on a message stored
// ahead of an earlier one of its key. It returns the UUIDs found.
func (c *orderChecker) check(t *testing.T, brokers []string, topic string) map[string]bool {
	t.Helper()
	n := kafkatest.RecordCount(t, brokers, topic)
	seen := map[string]bool{}
	next := map[string]int{}
	for _, r := range readBack(t, brokers, topic, int(n)) {
		id := r.msg.UUID
		key, ok := c.keyOf[id]
		if !ok {
			t.Fatalf("unexpected message %s", id)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		want := c.order[key][next[key]]
		if id != want {
			t.Fatalf("key %s: message %s stored before %s, an earlier message of the key", key, id, want)
		}
		next[key]++
	}
	return seen
}

// faultyProduce makes the broker answer a share of produce requests with
// errors instead of storing their batches, until stop is called: retriable
// ones (NOT_LEADER_FOR_PARTITION, REQUEST_TIMED_OUT), which the client
// retries until the record delivery timeout, and batch refusals
// (INVALID_RECORD, CORRUPT_MESSAGE), which fail the batch at once.
func faultyProduce(t *testing.T, b *devkafka.Broker, share float64, seed uint64) (stop func()) {
	t.Helper()
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed))
	on := true
	codes := []int16{kerr.NotLeaderForPartition.Code, kerr.RequestTimedOut.Code, kerr.InvalidRecord.Code, kerr.CorruptMessage.Code}
	kafkatest.FailProduce(b, func(int32) int16 {
		mu.Lock()
		defer mu.Unlock()
		if !on || rng.Float64() >= share {
			return 0
		}
		return codes[rng.IntN(len(codes))]
	})
	return func() {
		mu.Lock()
		on = false
		mu.Unlock()
	}
}

// A caller that sends, like the outbox relay, each key's messages in order
// and a failed message again (before the later ones of its key), against a
// broker that fails a third of the produce requests: whatever fails, no
// message is stored ahead of an earlier message of its key, and every
// message reported delivered is in the topic.
func TestPublishKeepsKeyOrderUnderBrokerFaults(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{Partitions: 4})
	topic := kafkatest.Topic()
	p := newPublisher(t, b.Addrs(),
		kgo.RecordDeliveryTimeout(time.Second),
		kgo.RecordRetries(3),
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }),
	)
	// Warm up (topic creation) before the faults start.
	if err := p.Publish(topic, newMessage(0, "warm")); err != nil {
		t.Fatal(err)
	}
	stop := faultyProduce(t, b, 0.35, 7)

	const keys, perKey, callSize = 200, 15, 700
	check := newOrderChecker()
	var pending []*message.Message
	warm := newMessage(0, "warm")
	check.add(warm)
	for i := 1; i <= keys*perKey; i++ {
		m := newMessage(i, "key-"+strconv.Itoa(i%keys))
		check.add(m)
		pending = append(pending, m)
	}
	delivered := map[string]bool{warm.UUID: true}
	dead := map[string]bool{} // keys whose message failed for good: the caller stops them
	var failures, permanent, calls int
	deadline := time.Now().Add(2 * time.Minute)
	for len(pending) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending after %d calls", len(pending), calls)
		}
		if calls++; calls == 60 {
			stop()
		}
		call := pending[:min(callSize, len(pending))]
		err := p.Publish(topic, call...)
		failed := map[string]error{}
		var be *core.BatchError
		if err != nil && !errors.As(err, &be) {
			t.Fatalf("Publish: %v, want nil or a BatchError", err)
		}
		if be != nil {
			for _, me := range be.Errors {
				failed[me.UUID] = me.Err
			}
		}
		var rest []*message.Message
		for _, m := range call {
			key := m.Metadata.Get(core.MetadataPartitionKey)
			err, bad := failed[m.UUID]
			switch {
			case dead[key]:
				if !bad {
					t.Fatalf("message %s of a dead key delivered", m.UUID)
				}
			case !bad:
				delivered[m.UUID] = true
			case core.IsPermanent(err):
				permanent++
				dead[key] = true
			default:
				failures++
				if !kafka.IsTemporary(err) {
					t.Fatalf("message %s: error %v is neither permanent nor temporary", m.UUID, err)
				}
				rest = append(rest, m)
			}
		}
		for _, m := range pending[len(call):] {
			if !dead[m.Metadata.Get(core.MetadataPartitionKey)] {
				rest = append(rest, m)
			}
		}
		// A failed message goes again before the later ones of its key:
		// rest keeps the original order.
		pending = rest
	}
	t.Logf("%d calls, %d temporary failures, %d messages failed for good", calls, failures, permanent)
	if failures == 0 {
		t.Fatal("no failures: the faults did not bite")
	}
	seen := check.check(t, b.Addrs(), topic)
	for id := range delivered {
		if !seen[id] {
			t.Fatalf("message %s reported delivered is not in the topic", id)
		}
	}
}

// A record larger than the topic's max.message.bytes (700 KB here, set
// when the topic is created, under the Publisher's 1 MB) is refused before
// sending, as permanent, and holds back the later messages of its key;
// everything else is delivered.
func TestPublishRecordOverTopicLimitHoldsItsKey(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, topic, -1, map[string]string{"max.message.bytes": "700000"})
	p := newPublisher(t, brokers)

	var msgs []*message.Message
	for i := range 9 {
		msgs = append(msgs, newMessage(i, "other-"+strconv.Itoa(i%3)))
	}
	k1, k2, k3 := newMessage(100, "k"), newMessage(101, "k"), newMessage(102, "k")
	k1.Payload = []byte(`"` + strings.Repeat("x", 800_000) + `"`)
	msgs = append(msgs[:3], append([]*message.Message{k1, k2}, append(msgs[3:6], append([]*message.Message{k3}, msgs[6:]...)...)...)...)

	err := p.Publish(topic, msgs...)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 3 {
		t.Fatalf("Publish: %v, want a BatchError naming the three messages of key k", err)
	}
	if be.Errors[0].UUID != k1.UUID || !errors.Is(be.Errors[0].Err, kafka.ErrMessageTooLarge) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("first failure %s: %v, want %s with a permanent ErrMessageTooLarge", be.Errors[0].UUID, be.Errors[0].Err, k1.UUID)
	}
	if !strings.Contains(be.Errors[0].Err.Error(), "700000") {
		t.Fatalf("error %v does not name the topic's limit", be.Errors[0].Err)
	}
	for i, held := range []*message.Message{k2, k3} {
		me := be.Errors[i+1]
		if me.UUID != held.UUID || !errors.Is(me.Err, kafka.ErrHeldBack) || core.IsPermanent(me.Err) || !kafka.IsTemporary(me.Err) {
			t.Fatalf("failure %d: %s %v, want %s held back, temporary", i+1, me.UUID, me.Err, held.UUID)
		}
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n != 9 {
		t.Fatalf("topic holds %d records, want the 9 of other keys", n)
	}
	for _, r := range readBack(t, brokers, topic, 9) {
		if r.key == "k" {
			t.Fatalf("message %s of key k was stored", r.msg.UUID)
		}
	}
}

// The topic's max.message.bytes is lowered while the Publisher runs: its
// batches, sized for the old limit, are refused for size by the broker. The
// Publisher learns the new limit and sends the refused records again alone
// (each fits), in order: nothing is lost, nothing dead-lettered, no key out
// of order.
func TestPublishTopicLimitLoweredWhileRunning(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{Partitions: 2})
	topic := kafkatest.Topic()
	logs := watermill.NewCaptureLogger()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.Addrs()}, logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	check := newOrderChecker()
	warm := newMessage(0, "a")
	check.add(warm)
	if err := p.Publish(topic, warm); err != nil {
		t.Fatal(err)
	}

	kafkatest.SetTopicConfig(t, b.Addrs(), topic, "max.message.bytes", "250000")

	for round := range 2 {
		var msgs []*message.Message
		for i := range 12 {
			m := newMessage(1+round*100+i, []string{"a", "b", "c"}[i%3])
			m.Payload = []byte(`"` + strings.Repeat("y", 100_000) + `"`)
			check.add(m)
			msgs = append(msgs, m)
		}
		if err := p.Publish(topic, msgs...); err != nil {
			t.Fatalf("round %d: Publish: %v, want every message delivered", round, err)
		}
	}
	if seen := check.check(t, b.Addrs(), topic); len(seen) != 25 {
		t.Fatalf("topic holds %d distinct messages, want 25", len(seen))
	}
	// The path under test was taken: batches refused for size, their
	// records sent again alone, the client renewed once.
	var refused, renewed int
	for _, m := range logs.Captured()[watermill.InfoLogLevel] {
		switch {
		case strings.HasPrefix(m.Msg, "Kafka batch refused by the broker"):
			refused++
		case strings.HasPrefix(m.Msg, "Kafka client renewed"):
			renewed++
		}
	}
	if refused == 0 || renewed != 1 {
		t.Fatalf("%d refused batches sent again, %d client renewals; want some and 1", refused, renewed)
	}
}

// The topic's max.message.bytes is lowered under a record while the
// Publisher runs: the broker refuses the record's batch, which holds records
// of other keys and, behind it, more of its own key (one partition). The
// record is reported too large for the new limit, permanently; the later
// records of its key are held back, not sent again alone and stored ahead
// of it; the other keys' records are delivered. On Apache Kafka the refused
// record fails for good in the first round, while the others of its batch
// are sent again alone.
func TestPublishRecordOverLoweredTopicLimitHoldsItsKey(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, topic, 1, nil)
	p := newPublisher(t, brokers)
	check := newOrderChecker()
	warm := newMessage(0, "a")
	check.add(warm)
	if err := p.Publish(topic, warm); err != nil {
		t.Fatal(err)
	}
	kafkatest.SetTopicConfig(t, brokers, topic, "max.message.bytes", "100000")

	big := newMessage(1, "k")
	big.Payload = []byte(`"` + strings.Repeat("x", 150_000) + `"`)
	held := []*message.Message{newMessage(2, "k"), newMessage(3, "k")}
	var others []*message.Message
	for i := range 12 {
		m := newMessage(10+i, []string{"a", "b", "c"}[i%3])
		check.add(m)
		others = append(others, m)
	}
	msgs := append(append(append([]*message.Message{}, others[:4]...), big), others[4:8]...)
	msgs = append(append(append(msgs, held[0]), others[8:]...), held[1])

	err := p.Publish(topic, msgs...)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 3 {
		t.Fatalf("Publish: %v, want a BatchError naming the three messages of key k", err)
	}
	if be.Errors[0].UUID != big.UUID || !errors.Is(be.Errors[0].Err, kafka.ErrMessageTooLarge) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("first failure %s: %v, want %s with a permanent ErrMessageTooLarge", be.Errors[0].UUID, be.Errors[0].Err, big.UUID)
	}
	for i, m := range held {
		me := be.Errors[i+1]
		if me.UUID != m.UUID || !kafka.IsTemporary(me.Err) || core.IsPermanent(me.Err) {
			t.Fatalf("failure %d: %s %v, want %s held back, temporary", i+1, me.UUID, me.Err, m.UUID)
		}
	}
	seen := check.check(t, brokers, topic)
	for _, m := range append([]*message.Message{big}, held...) {
		if seen[m.UUID] {
			t.Fatalf("message %s of key k was stored", m.UUID)
		}
	}
	if len(seen) != 1+len(others) {
		t.Fatalf("topic holds %d distinct messages, want %d", len(seen), 1+len(others))
	}
}

// A topic the broker refuses (INVALID_TOPIC_EXCEPTION: Kafka answers so for
// a name it does not accept; kfake accepts any name, so the answer is
// injected) fails every message of the call, permanently and at once: no
// message is at fault more than another, and retrying cannot help.
func TestPublishInvalidTopicIsPermanent(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{})
	kafkatest.FailProduce(b, func(int32) int16 { return kerr.InvalidTopicException.Code })
	p := newPublisher(t, b.Addrs())
	var msgs []*message.Message
	for i := range 50 {
		msgs = append(msgs, newMessage(i, "k"+strconv.Itoa(i%5)))
	}
	err := publishWithin(t, 10*time.Second, p, kafkatest.Topic(), msgs...)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != len(msgs) {
		t.Fatalf("Publish: %v, want a BatchError naming all %d messages", err, len(msgs))
	}
	for _, me := range be.Errors {
		if !core.IsPermanent(me.Err) || !errors.Is(me.Err, kerr.InvalidTopicException) {
			t.Fatalf("message %s: %v, want a permanent INVALID_TOPIC_EXCEPTION", me.UUID, me.Err)
		}
	}
}

// The property the Publisher builds on, checked on franz-go itself: with
// the idempotent producer, when a batch of a partition is refused, every
// record placed behind it in that partition fails too, even those in later
// batches (one partition, batches of a few records): what is stored is a
// prefix of what was produced. The first, or the second, produce request is
// refused (after the first succeeded the client pipelines).
//
// Placed, not merely handed to Produce: for a topic whose partitions the
// client has not learnt yet, Produce sets the records aside and the client
// partitions them when the metadata arrives. A refusal that comes back
// while that is under way fails only the records placed so far; the rest
// start fresh batches under a bumped producer epoch, from sequence 0, and
// the broker (Kafka as kfake) stores them. So, as the Publisher does, the
// test flushes only once every record is placed (the partitioned hook).
func TestFranzGoFailsThePartitionBehindAFailedBatch(t *testing.T) {
	t.Parallel()
	for _, failOn := range []int{1, 2} {
		t.Run("request "+strconv.Itoa(failOn), func(t *testing.T) {
			t.Parallel()
			b := kafkatest.Embedded(t, devkafka.Config{Partitions: 1})
			topic := kafkatest.Topic()
			if err := b.Cluster().CreateTopic(topic, 1, nil); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			requests := 0
			kafkatest.FailProduce(b, func(int32) int16 {
				mu.Lock()
				defer mu.Unlock()
				if requests++; requests == failOn {
					return kerr.InvalidRecord.Code
				}
				return 0
			})
			placed := make(chan struct{}, 200)
			cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.ManualFlushing(), kgo.ProducerBatchMaxBytes(1000),
				kgo.WithHooks(placedHook(placed)))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			const n = 200
			var wg sync.WaitGroup
			var mu2 sync.Mutex
			lastStored, firstFailed, stored := -1, n, 0
			wg.Add(n)
			for i := range n {
				cl.Produce(context.Background(), &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte(strings.Repeat("v", 150) + strconv.Itoa(i))}, func(_ *kgo.Record, err error) {
					mu2.Lock()
					if err != nil {
						firstFailed = min(firstFailed, i)
					} else {
						lastStored = max(lastStored, i)
						stored++
					}
					mu2.Unlock()
					wg.Done()
				})
			}
			deadline := time.After(30 * time.Second)
			for range n {
				select {
				case <-placed:
				case <-deadline:
					t.Fatal("records not placed in their partition within 30s")
				}
			}
			if err := cl.Flush(context.Background()); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			if firstFailed == n || lastStored > firstFailed {
				t.Fatalf("record %d stored after record %d failed (first failure at %d)", lastStored, firstFailed, firstFailed)
			}
			if failOn == 1 && stored != 0 || failOn == 2 && stored == 0 {
				t.Fatalf("%d records stored with request %d refused", stored, failOn)
			}
			if got := kafkatest.RecordCount(t, b.Addrs(), topic); got != int64(stored) {
				t.Fatalf("partition holds %d records, %d were acknowledged", got, stored)
			}
			t.Logf("%d stored, the rest (from %d) failed", stored, firstFailed)
		})
	}
}

// placedHook reports each record the client places in its partition.
type placedHook chan struct{}

func (h placedHook) OnProduceRecordPartitioned(*kgo.Record, int32) { h <- struct{}{} }

// A batch refused on the first Publish to a topic, while the client is
// still learning the topic's partitions (franz-go holds the records aside
// and partitions them when the metadata arrives, possibly while the first
// batch is already on its way): no message is stored ahead of an earlier
// one of its key. Several rounds, each on a fresh topic, since whether the
// refusal comes back before every record is partitioned is a matter of
// timing.
func TestPublishFirstBatchToNewTopicRefused(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{Partitions: 1})
	var mu sync.Mutex
	armed := false
	kafkatest.FailProduce(b, func(int32) int16 {
		mu.Lock()
		defer mu.Unlock()
		if armed {
			armed = false
			return kerr.InvalidRecord.Code
		}
		return 0
	})
	p := newPublisherWith(t, kafka.PublisherConfig{Brokers: b.Addrs(), MaxMessageBytes: 1000})
	for round := range 20 {
		topic := kafkatest.Topic()
		if err := b.Cluster().CreateTopic(topic, 1, nil); err != nil {
			t.Fatal(err)
		}
		check := newOrderChecker()
		var msgs []*message.Message
		for i := range 150 {
			m := newMessage(round*1000+i, "k"+strconv.Itoa(i%2))
			check.add(m)
			msgs = append(msgs, m)
		}
		mu.Lock()
		armed = true
		mu.Unlock()
		err := publishWithin(t, 30*time.Second, p, topic, msgs...)
		var be *core.BatchError
		if err != nil && !errors.As(err, &be) {
			t.Fatalf("round %d: Publish: %v, want nil or a BatchError", round, err)
		}
		failed := map[string]bool{}
		if be != nil {
			for _, me := range be.Errors {
				failed[me.UUID] = true
			}
		}
		held := map[string]bool{}
		for _, m := range msgs {
			key := m.Metadata.Get(core.MetadataPartitionKey)
			if failed[m.UUID] {
				held[key] = true
			} else if held[key] {
				t.Fatalf("round %d: message %s reported delivered after an earlier message of key %s failed", round, m.UUID, key)
			}
		}
		seen := check.check(t, b.Addrs(), topic)
		for _, m := range msgs {
			if !failed[m.UUID] && !seen[m.UUID] {
				t.Fatalf("round %d: message %s reported delivered is not in the topic", round, m.UUID)
			}
		}
	}
}
