package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// newSub returns a Subscriber in group with the tests' short intervals,
// closed when the test ends.
func newSub(t testing.TB, brokers []string, group string, mod ...func(*kafka.SubscriberConfig)) *kafka.Subscriber {
	t.Helper()
	cfg := kafka.SubscriberConfig{
		Brokers:         brokers,
		ConsumerGroup:   group,
		CommitInterval:  50 * time.Millisecond,
		NackResendSleep: 10 * time.Millisecond,
		SessionTimeout:  10 * time.Second,
		RevokeGrace:     2 * time.Second,
	}
	for _, m := range mod {
		m(&cfg)
	}
	s, err := kafka.NewSubscriber(cfg, testLogger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

var testLogger watermill.LoggerAdapter = watermill.NopLogger{}

// committed returns the group's committed offsets of topic by partition.
func committed(t testing.TB, brokers []string, group, topic string) map[int32]int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	rt.Partitions = []int32{0, 1, 2, 3, 4, 5, 6, 7}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]int64{}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// waitCommitted polls until the group's committed offsets of topic satisfy ok.
func waitCommitted(t testing.TB, brokers []string, group, topic string, ok func(map[int32]int64) bool) map[int32]int64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := committed(t, brokers, group, topic)
		if ok(c) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("committed offsets %v not as expected after 30s", c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func seqOf(t testing.TB, m *message.Message) int {
	t.Helper()
	n, err := strconv.Atoi(m.Metadata.Get("seq"))
	if err != nil {
		t.Fatalf("message %s: seq %q", m.UUID, m.Metadata.Get("seq"))
	}
	return n
}

// publishSeq publishes n numbered messages of key to topic.
func publishSeq(t testing.TB, brokers []string, topic string, n int, keyOf func(i int) string) []*message.Message {
	t.Helper()
	var msgs []*message.Message
	for i := range n {
		msgs = append(msgs, newMessage(i, keyOf(i)))
	}
	if err := newPublisher(t, brokers).Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	return msgs
}

func next[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return v
	case <-time.After(60 * time.Second):
		t.Fatal("nothing delivered within a minute")
	}
	panic("unreachable")
}

// A nacked message comes again, and the committed offset stops before it:
// a new member of the group starts from it.
func TestSubscriberNackNotCommittedPast(t *testing.T) {
	t.Parallel()
	brokers, topic, group := kafkatest.Brokers(t), kafkatest.Topic(), kafkatest.Group()
	publishSeq(t, brokers, topic, 10, func(int) string { return "one-key" })

	sub := newSub(t, brokers, group)
	ch, err := sub.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	var part int32
	for want := range 4 {
		m := next(t, ch)
		if got := seqOf(t, m); got != want {
			t.Fatalf("got message %d, want %d", got, want)
		}
		r, _ := kafka.RecordFromContext(m.Context())
		part = r.Partition
		m.Ack()
	}
	m := next(t, ch)
	if seqOf(t, m) != 4 {
		t.Fatalf("got %d, want 4", seqOf(t, m))
	}
	m.Nack()
	again := next(t, ch)
	if seqOf(t, again) != 4 || again.UUID != m.UUID {
		t.Fatalf("after a nack of 4 got %d (%s), want 4 again", seqOf(t, again), again.UUID)
	}
	waitCommitted(t, brokers, group, topic, func(c map[int32]int64) bool { return c[part] == 4 })
	// Left unacknowledged: Close commits nothing past it.
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}
	if c := committed(t, brokers, group, topic); c[part] != 4 {
		t.Fatalf("committed %d after Close, want 4", c[part])
	}

	sub2 := newSub(t, brokers, group)
	ch2, err := sub2.Subscribe(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	for want := 4; want < 10; want++ {
		m := next(t, ch2)
		if got := seqOf(t, m); got != want {
			t.Fatalf("new member: got %d, want %d", got, want)
		}
		m.Ack()
	}
	if err := sub2.Close(); err != nil {
		t.Fatal(err)
	}
	if c := committed(t, brokers, group, topic); c[part] != 10 {
		t.Fatalf("committed %d, want 10", c[part])
	}
}

// A batch is acknowledged as a whole or per message: the offset committed
// is the end of the acked prefix, and a nack sends the batch again from
// the nacked message, the acked messages after it included.
func TestSubscribeBatchAckAndNack(t *testing.T) {
	t.Parallel()
	brokers, topic, group := kafkatest.Brokers(t), kafkatest.Topic(), kafkatest.Group()
	const n = 300
	publishSeq(t, brokers, topic, n, func(int) string { return "one-key" })

	sub := newSub(t, brokers, group, func(c *kafka.SubscriberConfig) { c.MaxBatch = 100 })
	ch, err := sub.SubscribeBatch(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	// Ack everything before 150, nack 150 (acking those after it).
	nextSeq, biggest := 0, 0
	var part int32
	for nextSeq < 150 {
		b := next(t, ch)
		part = b.Partition
		biggest = max(biggest, len(b.Messages))
		for _, m := range b.Messages {
			if got := seqOf(t, m); got != nextSeq {
				t.Fatalf("got %d, want %d", got, nextSeq)
			}
			nextSeq++
			if seqOf(t, m) == 150 {
				m.Nack()
			} else {
				m.Ack()
			}
		}
	}
	b := next(t, ch)
	if got := seqOf(t, b.Messages[0]); got != 150 {
		t.Fatalf("after the nack the batch starts at %d, want 150", got)
	}
	c := waitCommitted(t, brokers, group, topic, func(c map[int32]int64) bool { return c[part] >= 150 })
	if c[part] != 150 {
		t.Fatalf("committed %d, want 150", c[part])
	}
	// Ack 150 and 151, nack the rest of the batch as a whole.
	b.Messages[0].Ack()
	if len(b.Messages) > 1 {
		b.Messages[1].Ack()
	}
	b.Nack()
	want := int64(150 + min(2, len(b.Messages)))
	waitCommitted(t, brokers, group, topic, func(c map[int32]int64) bool { return c[part] == want })
	b = next(t, ch) // delivered again from want, left unacknowledged
	if got := seqOf(t, b.Messages[0]); int64(got) != want {
		t.Fatalf("batch starts at %d, want %d", got, want)
	}
	if err := sub.Close(); err != nil {
		t.Fatal(err)
	}

	// A new member starts at the first message not acked; Batch.Ack
	// commits a whole batch.
	sub2 := newSub(t, brokers, group, func(c *kafka.SubscriberConfig) { c.MaxBatch = 100 })
	ch2, err := sub2.SubscribeBatch(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	nextSeq = int(want)
	for nextSeq < n {
		b := next(t, ch2)
		biggest = max(biggest, len(b.Messages))
		for _, m := range b.Messages {
			if got := seqOf(t, m); got != nextSeq {
				t.Fatalf("new member: got %d, want %d", got, nextSeq)
			}
			nextSeq++
		}
		b.Ack()
	}
	waitCommitted(t, brokers, group, topic, func(c map[int32]int64) bool { return c[part] == n })
	if biggest < 2 {
		t.Fatalf("every batch held one message; want many records of a partition in flight")
	}
	t.Logf("largest batch: %d messages", biggest)
}

// Records not written by a Watermill publisher: a record without a UUID
// gets the UUID of its place, the same on redelivery; hostile header bytes come
// through as they are; a record the Unmarshaler refuses is skipped and
// committed past.
func TestSubscriberHostileRecords(t *testing.T) {
	t.Parallel()
	brokers, topic := kafkatest.Brokers(t), kafkatest.Topic()
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	uuidHeader := func(v string) kgo.RecordHeader { return kgo.RecordHeader{Key: wkafka.UUIDHeaderKey, Value: []byte(v)} }
	recs := []*kgo.Record{
		{Value: []byte("no headers")},
		{Value: []byte("empty uuid"), Headers: []kgo.RecordHeader{uuidHeader("")}},
		{Value: []byte("two uuids"), Headers: []kgo.RecordHeader{uuidHeader("first"), uuidHeader("second")}},
		{Value: []byte("\xff\x00 bytes"), Key: []byte("\x00k\xff"), Headers: []kgo.RecordHeader{uuidHeader("hostile"), {Key: "\xffk\x00", Value: []byte("\xfe\x00")}}},
		{Value: []byte("refuse me"), Headers: []kgo.RecordHeader{uuidHeader("refused")}},
		{Value: []byte("last"), Headers: []kgo.RecordHeader{uuidHeader("last")}},
	}
	for _, r := range recs {
		r.Topic, r.Partition = topic, 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			group := kafkatest.Group()
			sub := newSub(t, brokers, group, func(c *kafka.SubscriberConfig) { c.Unmarshaler = refusing{} })
			var ch <-chan *message.Message
			if batch {
				bch, err := sub.SubscribeBatch(ctx, topic)
				if err != nil {
					t.Fatal(err)
				}
				flat := make(chan *message.Message)
				go func() {
					for b := range bch {
						for _, m := range b.Messages {
							flat <- m
						}
					}
				}()
				ch = flat
			} else {
				var err error
				if ch, err = sub.Subscribe(ctx, topic); err != nil {
					t.Fatal(err)
				}
			}
			// The UUID derived from a record's place, as the package documents it.
			place := func(offset int) string {
				return uuid.NewSHA1(uuid.MustParse("5b1e0c1e-6f0a-4a8e-9a57-6d696c6c7261"), fmt.Appendf(nil, "%s/0/%d", topic, offset)).String()
			}
			want := []string{place(0), place(1), "second", "hostile", "last"}
			if want[0] == want[1] {
				t.Error("two records without UUID got the same one")
			}
			// The first is nacked once: it comes again (with the rest of
			// its batch, in batch mode) under the same UUID.
			order := []int{0, 0, 1, 2, 3, 4}
			if batch {
				order = []int{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}
			}
			for i, w := range order {
				m := next(t, ch)
				if m.UUID != want[w] {
					t.Fatalf("delivery %d: UUID %q, want %q", i, m.UUID, want[w])
				}
				switch w {
				case 0:
					if r, ok := kafka.RecordFromContext(m.Context()); !ok || r.Key != nil {
						t.Errorf("nil key: %+v %v", r, ok)
					}
				case 3:
					if string(m.Payload) != "\xff\x00 bytes" || m.Metadata.Get("\xffk\x00") != "\xfe\x00" {
						t.Errorf("hostile bytes changed: payload %q metadata %q", m.Payload, m.Metadata)
					}
					if r, ok := kafka.RecordFromContext(m.Context()); !ok || string(r.Key) != "\x00k\xff" {
						t.Errorf("record %+v %v", r, ok)
					}
				case 4:
					if r, ok := kafka.RecordFromContext(m.Context()); !ok || r.Offset != 5 {
						t.Errorf("offset of the last: %+v %v, want 5", r, ok)
					}
				}
				if i == 0 {
					m.Nack()
				} else {
					m.Ack()
				}
			}
			// The refused record (offset 4) is passed: all six committed.
			waitCommitted(t, brokers, group, topic, func(c map[int32]int64) bool { return c[0] == 6 })
		})
	}
}

// refusing is the default unmarshaler, refusing records whose value is
// "refuse me".
type refusing struct{}

func (refusing) Unmarshal(r *kgo.Record) (*message.Message, error) {
	if string(r.Value) == "refuse me" {
		return nil, errors.New("refused")
	}
	return kafka.DefaultUnmarshaler().Unmarshal(r)
}

// A second member joins while the first holds a batch, and leaves holding
// one of its own: every record is acked at least once, each key's records
// are first acked in order, and the redeliveries are at least the batch the
// leaver held.
func TestSubscribeBatchRebalanceMidBatch(t *testing.T) {
	t.Parallel()
	brokers, topic, group := kafkatest.Brokers(t), kafkatest.Topic(), kafkatest.Group()
	const n, keys = 4000, 64
	publishSeq(t, brokers, topic, n, func(i int) string { return "key-" + strconv.Itoa(i%keys) })
	cfg := func(c *kafka.SubscriberConfig) { c.MaxBatch = 100 }

	var mu sync.Mutex
	acked := map[int]bool{}
	nextOfKey := map[int]int{} // key → the next seq expected to be acked first
	for k := range keys {
		nextOfKey[k] = k
	}
	deliveries := map[string]int{}
	batches := map[string]int{}
	ack := func(who string, b *core.Batch) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range b.Messages {
			s := seqOf(t, m)
			if acked[s] {
				continue
			}
			if k := s % keys; s != nextOfKey[k] {
				t.Errorf("%s: key %d: %d acked first before %d", who, k, s, nextOfKey[k])
			} else {
				nextOfKey[k] = s + keys
			}
			acked[s] = true
		}
		b.Ack()
	}
	count := func(who string, b *core.Batch) {
		mu.Lock()
		deliveries[who] += len(b.Messages)
		batches[who]++
		mu.Unlock()
	}
	ackedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(acked) }

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := newSub(t, brokers, group, cfg)
	chA, err := a.SubscribeBatch(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	first := next(t, chA)
	count("A", first)

	// B joins while A holds its first batch.
	b := newSub(t, brokers, group, cfg)
	chB, err := b.SubscribeBatch(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	bJoined := make(chan struct{})
	bHeld := make(chan int, 1)
	aDone := make(chan struct{})
	ackedAfterHold := make(chan struct{})
	go func() {
		held := next(t, chB)
		count("B", held)
		close(bJoined)
		// Leave with that batch unacknowledged once A has moved on.
		select {
		case <-ackedAfterHold:
		case <-ctx.Done():
		}
		bHeld <- len(held.Messages)
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}()
	go func() {
		defer close(aDone)
		select {
		case <-bJoined:
		case <-time.After(20 * time.Second):
			t.Error("B got nothing within 20 s of joining")
		}
		ack("A", first) // its partition may have been taken meanwhile: then it comes again
		var once sync.Once
		for ackedCount() < n {
			select {
			case bt := <-chA:
				count("A", bt)
				ack("A", bt)
				once.Do(func() { close(ackedAfterHold) })
			case <-ctx.Done():
				t.Errorf("acked %d of %d before the deadline", ackedCount(), n)
				return
			}
		}
	}()
	<-aDone
	held := <-bHeld
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if got := ackedCount(); got != n {
		t.Fatalf("acked %d of %d records", got, n)
	}
	total := deliveries["A"] + deliveries["B"]
	redelivered := total - n
	t.Logf("%d records: %d deliveries (A %d in %d batches, B %d in %d batches), %d redelivered; B left holding %d",
		n, total, deliveries["A"], batches["A"], deliveries["B"], batches["B"], redelivered, held)
	if redelivered < held {
		t.Fatalf("redelivered %d, fewer than the %d B left unacknowledged", redelivered, held)
	}
	hw := kafkatest.RecordCount(t, brokers, topic)
	c := committed(t, brokers, group, topic)
	var sum int64
	for _, off := range c {
		sum += off
	}
	if sum != hw {
		t.Fatalf("committed %d records' offsets, topic holds %d", sum, hw)
	}
}

// NewSubscriber refuses a config it cannot work with, wrapping
// core.ErrConfig, and a broker that does not answer.
func TestNewSubscriberRefuses(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	for name, cfg := range map[string]kafka.SubscriberConfig{
		"no brokers":     {ConsumerGroup: "g"},
		"no group":       {Brokers: brokers},
		"initial offset": {Brokers: brokers, ConsumerGroup: "g", InitialOffset: 5},
		"negative batch": {Brokers: brokers, ConsumerGroup: "g", MaxBatch: -1},
	} {
		if _, err := kafka.NewSubscriber(cfg, nil); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v, want core.ErrConfig", name, err)
		}
	}
	_, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: []string{"127.0.0.1:1"}, ConsumerGroup: "g",
		ClientOptions: []kgo.Opt{kgo.DialTimeout(200 * time.Millisecond)}}, nil)
	if err == nil || errors.Is(err, core.ErrConfig) {
		t.Errorf("unreachable broker: %v", err)
	}
}
