package kafka_test

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/kafka"
)

// TestMain checks for leaked goroutines. Besides leaktest's list it ignores
// the timer of sarama's circuit breaker: a producer whose breaker opened
// (the broker-down test) leaves it sleeping out its 10 s after Close; it
// then ends by itself.
func TestMain(m *testing.M) {
	opts := append([]goleak.Option{
		goleak.IgnoreAnyFunction("github.com/eapache/go-resiliency/breaker.(*Breaker).timer"),
	}, leaktest.Options...)
	goleak.VerifyTestMain(m, opts...)
}

func newPublisher(t testing.TB, brokers []string, opts ...kgo.Opt) *kafka.Publisher {
	t.Helper()
	return newPublisherWith(t, kafka.PublisherConfig{Brokers: brokers, ClientOptions: opts})
}

func newPublisherWith(t testing.TB, cfg kafka.PublisherConfig) *kafka.Publisher {
	t.Helper()
	p, err := kafka.NewPublisher(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p
}

// received is one message read back, with the record key.
type received struct {
	msg *message.Message
	key string
}

// readBack reads the first n messages of topic with kafkatest.Read (a fresh
// consumer group), each with its record key.
func readBack(t *testing.T, brokers []string, topic string, n int) []received {
	t.Helper()
	var out []received
	for _, m := range kafkatest.Read(t, brokers, topic, n) {
		key, _ := wkafka.MessageKeyFromCtx(m.Context())
		out = append(out, received{msg: m, key: string(key)})
	}
	return out
}

func newMessage(i int, key string) *message.Message {
	m := message.NewMessage(fmt.Sprintf("00000000-0000-4000-8000-%012d", i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
	m.Metadata.Set(core.MetadataPartitionKey, key)
	m.Metadata.Set(core.MetadataEventType, "Numbered")
	m.Metadata.Set("seq", strconv.Itoa(i))
	return m
}

func TestPublishBatchReadBack(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p := newPublisher(t, brokers)

	const total, keys, perCall = 5000, 50, 2500
	sent := make(map[string]*message.Message, total)
	var msgs []*message.Message
	for i := range total {
		m := newMessage(i, "key-"+strconv.Itoa(i%keys))
		sent[m.UUID] = m
		msgs = append(msgs, m)
	}
	for i := 0; i < total; i += perCall {
		if err := p.Publish(topic, msgs[i:i+perCall]...); err != nil {
			t.Fatal(err)
		}
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n != total {
		t.Fatalf("topic holds %d records, want %d", n, total)
	}

	got := readBack(t, brokers, topic, total)
	lastSeq := map[string]int{}
	seen := map[string]bool{}
	for _, r := range got {
		want, ok := sent[r.msg.UUID]
		if !ok {
			t.Fatalf("unexpected message %q", r.msg.UUID)
		}
		if seen[r.msg.UUID] {
			t.Fatalf("message %s read twice", r.msg.UUID)
		}
		seen[r.msg.UUID] = true
		if string(r.msg.Payload) != string(want.Payload) {
			t.Fatalf("message %s: payload %q, want %q", r.msg.UUID, r.msg.Payload, want.Payload)
		}
		if len(r.msg.Metadata) != len(want.Metadata) {
			t.Fatalf("message %s: metadata %v, want %v", r.msg.UUID, r.msg.Metadata, want.Metadata)
		}
		for k, v := range want.Metadata {
			if r.msg.Metadata.Get(k) != v {
				t.Fatalf("message %s: metadata %s=%q, want %q", r.msg.UUID, k, r.msg.Metadata.Get(k), v)
			}
		}
		key := want.Metadata.Get(core.MetadataPartitionKey)
		if r.key != key {
			t.Fatalf("message %s: record key %q, want %q", r.msg.UUID, r.key, key)
		}
		seq, _ := strconv.Atoi(r.msg.Metadata.Get("seq"))
		if last, ok := lastSeq[key]; ok && seq <= last {
			t.Fatalf("key %s: message %d arrived after %d", key, seq, last)
		}
		lastSeq[key] = seq
	}
	if len(lastSeq) != keys {
		t.Fatalf("read %d keys, want %d", len(lastSeq), keys)
	}
}

// A too-large message fails alone among other keys; the later message of
// its own key is held back (not sent, not permanent) so it cannot overtake it.
func TestPublishTooLargeMessageFailsAndHoldsItsKey(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p := newPublisherWith(t, kafka.PublisherConfig{Brokers: brokers, MaxMessageBytes: 10_000})

	var msgs []*message.Message
	for i := range 11 {
		msgs = append(msgs, newMessage(i, "k"+strconv.Itoa(i%3)))
	}
	big := msgs[5]
	big.Payload = make([]byte, 20_000)

	err := p.Publish(topic, msgs...)
	var be *core.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("Publish: %v, want a *core.BatchError", err)
	}
	held := msgs[8] // the next message of big's key, k2
	if len(be.Errors) != 2 || be.Errors[0].UUID != big.UUID || be.Errors[1].UUID != held.UUID {
		t.Fatalf("failed messages %+v, want %s then %s", be.Errors, big.UUID, held.UUID)
	}
	if !core.IsPermanent(be.Errors[0].Err) || !core.IsPermanent(err) {
		t.Fatalf("error %v is not permanent", be.Errors[0].Err)
	}
	if !errors.Is(be.Errors[0].Err, kafka.ErrMessageTooLarge) {
		t.Fatalf("error %v does not match ErrMessageTooLarge", err)
	}
	if !errors.Is(be.Errors[1].Err, kafka.ErrHeldBack) || core.IsPermanent(be.Errors[1].Err) {
		t.Fatalf("held message error %v: want a temporary ErrHeldBack", be.Errors[1].Err)
	}

	got := readBack(t, brokers, topic, 9)
	for _, r := range got {
		if r.msg.UUID == big.UUID || r.msg.UUID == held.UUID {
			t.Fatalf("message %s arrived", r.msg.UUID)
		}
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n != 9 {
		t.Fatalf("topic holds %d records, want 9", n)
	}
}

func TestPublishMarshalErrorFailsAlone(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p := newPublisher(t, brokers)

	msgs := []*message.Message{newMessage(1, "a"), newMessage(2, "a"), newMessage(3, "a"), newMessage(4, "b")}
	msgs[1].Metadata.Set(wkafka.UUIDHeaderKey, "reserved")
	err := p.Publish(topic, msgs...)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 2 || be.Errors[0].UUID != msgs[1].UUID || be.Errors[1].UUID != msgs[2].UUID {
		t.Fatalf("Publish: %v, want a BatchError naming %s and the message held behind it, %s", err, msgs[1].UUID, msgs[2].UUID)
	}
	if !errors.Is(be.Errors[0].Err, kafka.ErrMarshal) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("error %v: want a permanent ErrMarshal", be.Errors[0].Err)
	}
	if !errors.Is(be.Errors[1].Err, kafka.ErrHeldBack) {
		t.Fatalf("error %v: want ErrHeldBack", be.Errors[1].Err)
	}
	got := readBack(t, brokers, topic, 2)
	if got[0].msg.UUID != msgs[0].UUID && got[1].msg.UUID != msgs[0].UUID {
		t.Fatalf("read %s, %s; want %s and %s", got[0].msg.UUID, got[1].msg.UUID, msgs[0].UUID, msgs[3].UUID)
	}
}

// byCustomer keys records by the metadata "customer", in DefaultMarshaler's
// format otherwise, and refuses a message with the metadata "refuse": with
// the record key it would have had when sayKey, with no record otherwise.
type byCustomer struct{ sayKey bool }

func (m byCustomer) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	key := []byte(msg.Metadata.Get("customer"))
	if msg.Metadata.Get("refuse") != "" {
		if m.sayKey {
			return &kgo.Record{Key: key}, errors.New("refused")
		}
		return nil, errors.New("refused")
	}
	r, err := kafka.DefaultMarshaler().Marshal(topic, msg)
	if err != nil {
		return nil, err
	}
	r.Key = key
	return r, nil
}

// A custom Marshaler keys records by another field (messages that carry
// no partition key: see TestPublishRefusesARecordNotKeyedByItsPartitionKey):
// a message it refuses holds back the later messages of its RECORD key (a
// later message of that customer for another order is not stored past it). A refusal that says the key holds back that key only; one that
// does not holds back the rest of its topic, and no other topic.
func TestPublishMarshalErrorHoldsTheRecordKey(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	for _, sayKey := range []bool{true, false} {
		t.Run(fmt.Sprintf("sayKey=%v", sayKey), func(t *testing.T) {
			t.Parallel()
			topic, other := kafkatest.Topic(), kafkatest.Topic()
			p := newPublisherWith(t, kafka.PublisherConfig{Brokers: brokers, Marshaler: byCustomer{sayKey: sayKey}})
			msg := func(i int, customer, order string) *message.Message {
				m := newMessage(i, order)
				delete(m.Metadata, core.MetadataPartitionKey) // keyed by customer alone
				m.Metadata.Set("order", order)
				m.Metadata.Set("customer", customer)
				return m
			}
			msgs := []*message.Message{msg(1, "alice", "order-1"), msg(2, "alice", "order-2"), msg(3, "alice", "order-3"), msg(4, "bob", "order-2")}
			msgs[1].Metadata.Set("refuse", "yes")
			elsewhere := msg(5, "alice", "order-2")
			err := p.PublishTopics(map[string][]*message.Message{topic: msgs, other: {elsewhere}})
			var be *core.BatchError
			if !errors.As(err, &be) {
				t.Fatalf("PublishTopics: %v, want a BatchError", err)
			}
			failed := map[string]error{}
			for _, me := range be.Errors {
				failed[me.UUID] = me.Err
			}
			if err := failed[msgs[1].UUID]; !errors.Is(err, kafka.ErrMarshal) || !core.IsPermanent(err) {
				t.Errorf("the refused message: %v, want a permanent ErrMarshal", err)
			}
			if err := failed[msgs[2].UUID]; !errors.Is(err, kafka.ErrHeldBack) {
				t.Errorf("alice's next message (another order): %v, want ErrHeldBack", err)
			}
			wantStored := []*message.Message{msgs[0], msgs[3]} // bob's goes: the key is known
			if !sayKey {
				wantStored = wantStored[:1]
				if err := failed[msgs[3].UUID]; !errors.Is(err, kafka.ErrHeldBack) {
					t.Errorf("bob's message behind a refusal of unknown key: %v, want ErrHeldBack", err)
				}
			}
			if len(be.Errors) != len(msgs)-len(wantStored) {
				t.Errorf("%d failed: %v; want %d", len(be.Errors), err, len(msgs)-len(wantStored))
			}
			var got []string
			for _, r := range readBack(t, brokers, topic, len(wantStored)) {
				got = append(got, r.msg.UUID)
				if want := r.msg.Metadata.Get("customer"); r.key != want {
					t.Errorf("message %s keyed %q, want %q", r.msg.UUID, r.key, want)
				}
			}
			var want []string
			for _, m := range wantStored {
				want = append(want, m.UUID)
			}
			if slices.Sort(got); !slices.Equal(got, want) {
				t.Errorf("stored %v, want %v", got, want)
			}
			if n := kafkatest.RecordCount(t, brokers, topic); n != int64(len(wantStored)) {
				t.Errorf("topic holds %d records, want %d", n, len(wantStored))
			}
			if n := kafkatest.RecordCount(t, brokers, other); n != 1 {
				t.Errorf("the other topic holds %d records, want 1: a refusal holds back its own topic only", n)
			}
		})
	}
}

// shortTimeouts gives up on an unreachable broker within a few seconds.
func shortTimeouts() []kgo.Opt {
	return []kgo.Opt{
		kgo.DialTimeout(500 * time.Millisecond),
		kgo.RecordDeliveryTimeout(2 * time.Second),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}
}

// publishWithin runs Publish and fails the test if it takes longer than d.
func publishWithin(t *testing.T, d time.Duration, p *kafka.Publisher, topic string, msgs ...*message.Message) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.Publish(topic, msgs...) }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("Publish did not return within %s", d)
		return nil
	}
}

func TestPublishBrokerDownFailsEveryMessageRetryably(t *testing.T) {
	t.Parallel()
	b, restart := kafkatest.Restartable(t)
	topic := kafkatest.Topic()
	p := newPublisher(t, b.Addrs(), shortTimeouts()...)

	if err := p.Publish(topic, newMessage(0, "a"), newMessage(1, "b")); err != nil {
		t.Fatal(err)
	}
	b.Close()

	var msgs []*message.Message
	for i := range 20 {
		msgs = append(msgs, newMessage(100+i, "k"+strconv.Itoa(i%4)))
	}
	start := time.Now()
	err := publishWithin(t, 30*time.Second, p, topic, msgs...)
	t.Logf("Publish with the broker down returned after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var be *core.BatchError
	if !errors.As(err, &be) {
		t.Fatalf("Publish: %v, want a *core.BatchError", err)
	}
	if core.IsPermanent(err) {
		t.Fatalf("error %v is permanent; a broker outage is not", err)
	}
	failed := map[string]bool{}
	for _, me := range be.Errors {
		failed[me.UUID] = true
		if !kafka.IsTemporary(me.Err) {
			t.Fatalf("message %s: error %v does not say it is temporary", me.UUID, me.Err)
		}
	}
	for _, m := range msgs {
		if !failed[m.UUID] {
			t.Fatalf("message %s missing from the BatchError %v", m.UUID, err)
		}
	}
	if len(be.Errors) != len(msgs) {
		t.Fatalf("BatchError lists %d messages, want %d", len(be.Errors), len(msgs))
	}

	// The broker comes back: the same publisher delivers again within
	// seconds. Only the messages a BatchError names are sent again, so the
	// topic must end up with each message exactly once.
	b2 := restart()
	start = time.Now()
	pending := msgs
	for attempt := 1; len(pending) > 0; attempt++ {
		err = publishWithin(t, 30*time.Second, p, topic, pending...)
		if err == nil {
			t.Logf("all delivered %s after the restart, in %d attempts", time.Since(start).Round(time.Millisecond), attempt)
			break
		}
		if !errors.As(err, &be) || core.IsPermanent(err) {
			t.Fatalf("Publish after the restart: %v, want a retryable BatchError", err)
		}
		if time.Since(start) > 7*time.Second {
			t.Fatalf("Publish %s after the restart still fails: %v", time.Since(start).Round(time.Millisecond), err)
		}
		failed := map[string]bool{}
		for _, me := range be.Errors {
			failed[me.UUID] = true
		}
		var next []*message.Message
		for _, m := range pending {
			if failed[m.UUID] {
				next = append(next, m)
			}
		}
		pending = next
		time.Sleep(100 * time.Millisecond) // retry pace, as a relay would back off
	}
	if n := kafkatest.RecordCount(t, b2.Addrs(), topic); n != 22 {
		t.Fatalf("topic holds %d records after recovery, want 22", n)
	}
}

func TestNewPublisherUnreachableBrokerFailsFast(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	start := time.Now()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{addr}}, nil)
	elapsed := time.Since(start)
	if err == nil {
		p.Close()
		t.Fatal("NewPublisher succeeded against a closed port")
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("error %q does not name the broker %s", err, addr)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("NewPublisher took %s to fail", elapsed)
	}
	t.Logf("failed after %s: %v", elapsed.Round(time.Millisecond), err)
}

func TestNewPublisherValidates(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]kafka.PublisherConfig{
		"no brokers":             {},
		"empty broker":           {Brokers: []string{" "}},
		"MaxMessageBytes small":  {Brokers: []string{"127.0.0.1:1"}, MaxMessageBytes: 100},
		"no idempotence":         {Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}},
		"no idempotence, 5 sent": {Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(5), kgo.RequiredAcks(kgo.LeaderAck())}},
		"leader acks only":       {Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}},
		"transactional":          {Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.TransactionalID("x")}},
		"manual flushing":        {Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.ManualFlushing()}},
	} {
		_, err := kafka.NewPublisher(cfg, nil)
		if !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: NewPublisher error %v, want core.ErrConfig", name, err)
		}
	}
	// The error says which setting and why.
	_, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{"127.0.0.1:1"}, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}}, nil)
	if err == nil || !strings.Contains(err.Error(), "DisableIdempotentWrite") || !strings.Contains(err.Error(), "order") {
		t.Errorf("error %v does not name the setting and the order promise", err)
	}
}

func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: kafkatest.Brokers(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	m := newMessage(1, "a")
	err = p.Publish(kafkatest.Topic(), m)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 1 || be.Errors[0].UUID != m.UUID {
		t.Fatalf("Publish after Close: %v, want a BatchError naming %s", err, m.UUID)
	}
	if !errors.Is(err, kafka.ErrClosed) || core.IsPermanent(err) {
		t.Fatalf("Publish after Close: %v, want a non-permanent ErrClosed", err)
	}
}

func TestPublishConcurrently(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p := newPublisher(t, brokers)

	const goroutines, batches, size = 4, 5, 100
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*batches)
	for g := range goroutines {
		wg.Go(func() {
			for b := range batches {
				var msgs []*message.Message
				for i := range size {
					n := (g*batches+b)*size + i
					msgs = append(msgs, newMessage(n, "g"+strconv.Itoa(g)))
				}
				errs <- p.Publish(topic, msgs...)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n != goroutines*batches*size {
		t.Fatalf("topic holds %d records, want %d", n, goroutines*batches*size)
	}
}

// TestCloseWhilePublishing closes the publisher under concurrent Publish
// calls: each call delivers its batch or names the messages it did not
// deliver, each with ErrClosed (temporary), and nothing panics. A message
// failed by Close may have reached the broker (its acknowledgement was
// lost), so the topic holds at least what was reported delivered.
func TestCloseWhilePublishing(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}

	const goroutines, size = 4, 50
	var delivered atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for b := 0; ; b++ {
				var msgs []*message.Message
				for i := range size {
					msgs = append(msgs, newMessage((g*1000+b)*size+i, "g"+strconv.Itoa(g)))
				}
				err := p.Publish(topic, msgs...)
				if err == nil {
					delivered.Add(size)
					continue
				}
				var be *core.BatchError
				if !errors.As(err, &be) || len(be.Errors) == 0 || len(be.Errors) > size {
					errs <- fmt.Errorf("Publish: %v, want nil or a BatchError naming some of the %d messages", err, size)
					return
				}
				delivered.Add(int64(size - len(be.Errors)))
				for _, me := range be.Errors {
					if !errors.Is(me.Err, kafka.ErrClosed) && !errors.Is(me.Err, kafka.ErrHeldBack) || !kafka.IsTemporary(me.Err) {
						errs <- fmt.Errorf("message %s: %v, want a temporary ErrClosed", me.UUID, me.Err)
						return
					}
				}
				return
			}
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for delivered.Load() < goroutines*size*3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d messages delivered before the deadline", delivered.Load())
		}
		runtime.Gosched()
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := kafkatest.RecordCount(t, brokers, topic); n < delivered.Load() {
		t.Fatalf("topic holds %d records, %d were reported delivered", n, delivered.Load())
	}
}

// BenchmarkPublish publishes batches of 1000 messages on 100 keys (an op is
// one batch) to the embedded broker, in this process, or to the cluster in
// KAFKA_BROKERS (for example a millrace-kafka process).
func BenchmarkPublish(b *testing.B) {
	p := newPublisher(b, kafkatest.Brokers(b))
	benchmarkPublisher(b, p)
}

// BenchmarkPublishWatermillKafka is the baseline: watermill-kafka v3's
// Publisher, which sends one message at a time, with the same producer
// settings and messages.
func BenchmarkPublishWatermillKafka(b *testing.B) {
	p, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers:               kafkatest.Brokers(b),
		Marshaler:             kafkatest.WatermillMarshaler(),
		OverwriteSaramaConfig: kafkatest.SaramaConfig(),
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	benchmarkPublisher(b, p)
}

func benchmarkPublisher(b *testing.B, p message.Publisher) {
	topic := kafkatest.Topic()
	const batch = 1000
	msgs := make([]*message.Message, batch)
	for i := range msgs {
		msgs[i] = newMessage(i, "key-"+strconv.Itoa(i%100))
	}
	if err := p.Publish(topic, msgs...); err != nil { // topic creation, metadata
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := p.Publish(topic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
}

// A broker that comes back without its data makes the topic again under a
// new id on first use; franz-go, holding the old id, is answered
// UNKNOWN_TOPIC_ID for as long as its client lives. The Publisher fails
// such a call temporarily and renews its client, so a retry delivers.
func TestPublishAfterBrokerLostTheTopicID(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{})
	port := b.Port()
	topic := kafkatest.Topic()
	p := newPublisher(t, b.Addrs(), shortTimeouts()...)
	if err := p.Publish(topic, newMessage(0, "a"), newMessage(1, "b")); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b2 := kafkatest.Embedded(t, devkafka.Config{Port: port}) // empty: the topic is gone

	start := time.Now()
	pending := []*message.Message{newMessage(2, "a"), newMessage(3, "b"), newMessage(4, "c")}
	for attempt := 1; len(pending) > 0; attempt++ {
		err := publishWithin(t, 30*time.Second, p, topic, pending...)
		if err == nil {
			t.Logf("delivered %s after the restart, in %d attempts", time.Since(start).Round(time.Millisecond), attempt)
			break
		}
		var be *core.BatchError
		if !errors.As(err, &be) || core.IsPermanent(err) {
			t.Fatalf("Publish after the restart: %v, want a retryable BatchError", err)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("Publish %s after the restart still fails: %v", time.Since(start).Round(time.Millisecond), err)
		}
		failed := map[string]bool{}
		for _, me := range be.Errors {
			failed[me.UUID] = true
		}
		var next []*message.Message
		for _, m := range pending {
			if failed[m.UUID] {
				next = append(next, m)
			}
		}
		pending = next
		time.Sleep(100 * time.Millisecond) // retry pace, as a relay would back off
	}
	if n := kafkatest.RecordCount(t, b2.Addrs(), topic); n != 3 {
		t.Fatalf("the new topic holds %d records, want the 3 published after the restart", n)
	}
}
