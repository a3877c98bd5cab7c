package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/outbox"
)

func kafkaPublisher(t testing.TB, brokers []string) *wkafka.Publisher {
	t.Helper()
	p, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers: brokers, Marshaler: wkafka.DefaultMarshaler{}, OverwriteSaramaConfig: kafkatest.SaramaConfig(),
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// createTopics creates the test's topics before anything is published to
// them: a producer that creates a topic by publishing to it may be told,
// on a cluster, that the topic does not exist yet, and give up.
func createTopics(t testing.TB, brokers []string, topics ...string) {
	t.Helper()
	for _, topic := range topics {
		kafkatest.CreateTopic(t, brokers, topic, -1, nil)
	}
}

// collect subscribes to topic and gathers what arrives, until the test ends.
type collector struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (c *collector) handle(m *message.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m.Copy())
	return nil
}

func (c *collector) snapshot() []*message.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*message.Message(nil), c.msgs...)
}

func startRouter(t testing.TB, r *message.Router) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("router close: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("router run: %v", err)
		}
	})
	select {
	case <-r.Running():
	case <-time.After(30 * time.Second):
		t.Fatal("router did not start")
	}
}

// End to end through the Kafka protocol: a Router with PoisonQueue, Retry
// and the dedup middleware consumes events (each published twice, one
// without an id); the handler writes an effect and emits an event through
// the outbox in the same transaction. Exactly one effect and one emitted
// event per event; the message without an id lands on the poison topic
// with its reason. A Receiver on the same topic stores each event once.
func TestKafkaRouterDedupPoisonAndOutbox(t *testing.T) {
	t.Parallel()
	const n = 50
	b := setup(t, 8)
	brokers := kafkatest.Brokers(t)
	topic, poisonTopic := kafkatest.Topic(), kafkatest.Topic()
	createTopics(t, brokers, topic, poisonTopic)
	pub := kafkaPublisher(t, brokers)

	var sent []*message.Message
	for i := range n {
		m := message.NewMessage(uuid.NewString(), []byte(`{"order":1}`))
		m.Metadata.Set(core.MetadataPartitionKey, "order-"+string(rune('a'+i%5)))
		sent = append(sent, m)
	}
	bad := message.NewMessage("order-without-id", []byte(`{}`))
	for _, m := range append(append(append([]*message.Message{}, sent...), bad), sent...) { // every good one twice
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}

	writer, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	emit := writer.ContextPublisher()
	dedup := newDedup(t, b, "billing")
	receiver := newReceiver(t, b, "audit")
	pq, err := middleware.PoisonQueue(pub, poisonTopic)
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, ShouldRetry: inbox.ShouldRetry}

	var calls atomic.Int32
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	h := router.AddConsumerHandler("billing", topic, kafkatest.NewSubscriber(t, brokers), func(msg *message.Message) error {
		calls.Add(1)
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return errors.New("no tx")
		}
		if err := b.apply(msg.Context(), tx, msg.UUID, ""); err != nil {
			return err
		}
		out := message.NewMessage(uuid.NewString(), []byte(`{"charged":true}`))
		out.Metadata.Set(core.MetadataPartitionKey, msg.Metadata.Get(core.MetadataPartitionKey))
		out.SetContext(msg.Context()) // carries the dedup transaction
		return emit.Publish("payments", out)
	})
	// PoisonQueue outermost, Retry, then dedup innermost.
	var deliveries atomic.Int32
	counting := func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) { deliveries.Add(1); return next(m) }
	}
	h.AddMiddleware(pq, retry.Middleware, counting, dedup.Middleware)
	router.AddConsumerHandler("audit", topic, kafkatest.NewSubscriber(t, brokers), receiver.Handle)
	poisoned := &collector{}
	router.AddConsumerHandler("poison-reader", poisonTopic, kafkatest.NewSubscriber(t, brokers), poisoned.handle)
	startRouter(t, router)

	waitFor(t, 60*time.Second, "effects, stored rows and the poisoned message", func() bool {
		return b.effects(t) >= n && len(poisoned.snapshot()) >= 1 &&
			b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")) >= n
	})
	// Every delivery (each good event twice, the bad one once) has reached
	// the dedup middleware, so a duplicate that slipped through would show.
	waitFor(t, 30*time.Second, "every delivery", func() bool { return deliveries.Load() >= 2*n+1 })
	if got := b.effects(t); got != n {
		t.Fatalf("effects = %d, want %d", got, n)
	}
	if got := b.distinctEffects(t); got != n || calls.Load() != n {
		t.Fatalf("distinct effects = %d, handler calls = %d, want %d", got, calls.Load(), n)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("outbox_event")+` WHERE topic = 'payments'`); got != n {
		t.Fatalf("emitted events = %d, want %d (one per applied event)", got, n)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE consumer = 'audit' AND topic = $1`, topic); got != n {
		t.Fatalf("stored rows = %d, want %d", got, n)
	}
	p := poisoned.snapshot()
	if len(p) != 1 || p[0].UUID != bad.UUID {
		t.Fatalf("poison topic has %d messages (%v), want the one without an id", len(p), p)
	}
	reason := p[0].Metadata.Get(middleware.ReasonForPoisonedKey)
	if !strings.Contains(reason, "no usable event id") || !strings.Contains(reason, bad.UUID) {
		t.Fatalf("poison reason = %q", reason)
	}
	if p[0].Metadata.Get(middleware.PoisonedTopicKey) != topic {
		t.Fatalf("poisoned topic = %q", p[0].Metadata.Get(middleware.PoisonedTopicKey))
	}
}

// A retry topic and a dead-letter topic: the main handler's failures go to
// the retry topic, whose handler (same consumer name, same dedup) applies
// them once; what fails there too goes to the dead-letter topic.
func TestKafkaRetryTopicAndDeadLetterTopic(t *testing.T) {
	t.Parallel()
	b := setup(t, 6)
	brokers := kafkatest.Brokers(t)
	topic, retryTopic, dlqTopic := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
	createTopics(t, brokers, topic, retryTopic, dlqTopic)
	pub := kafkaPublisher(t, brokers)
	flaky, broken := message.NewMessage(uuid.NewString(), []byte(`{}`)), message.NewMessage(uuid.NewString(), []byte(`{}`))
	for _, m := range []*message.Message{flaky, broken, flaky} { // flaky is delivered twice on the main topic
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	dedup := newDedup(t, b, "shipping")
	var flakyCalls atomic.Int32
	handler := func(msg *message.Message) error {
		tx, _ := core.TxFromContext(msg.Context())
		if err := b.apply(msg.Context(), tx, msg.UUID, message.SubscribeTopicFromCtx(msg.Context())); err != nil {
			return err
		}
		if msg.UUID == broken.UUID {
			return errors.New("broken for good")
		}
		if msg.UUID == flaky.UUID && flakyCalls.Add(1) == 1 {
			return errors.New("flaky once")
		}
		return nil
	}
	toRetry, _ := middleware.PoisonQueue(pub, retryTopic)
	toDLQ, _ := middleware.PoisonQueue(pub, dlqTopic)
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router.AddConsumerHandler("main", topic, kafkatest.NewSubscriber(t, brokers), handler).AddMiddleware(toRetry, dedup.Middleware)
	var retried atomic.Int32 // deliveries on the retry topic
	countRetried := func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) { retried.Add(1); return next(m) }
	}
	router.AddConsumerHandler("retry", retryTopic, kafkatest.NewSubscriber(t, brokers), handler).AddMiddleware(toDLQ, countRetried, dedup.Middleware)
	dead := &collector{}
	router.AddConsumerHandler("dlq-reader", dlqTopic, kafkatest.NewSubscriber(t, brokers), dead.handle)
	startRouter(t, router)

	waitFor(t, 60*time.Second, "the dead letter", func() bool { return len(dead.snapshot()) == 1 })
	// Both failures of the main topic (flaky's first delivery and broken)
	// went through the retry topic.
	waitFor(t, 30*time.Second, "the retry topic", func() bool { return retried.Load() >= 2 })
	waitFor(t, 30*time.Second, "the flaky event's effect", func() bool {
		return b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE event_id = $1`, flaky.UUID) >= 1
	})
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE event_id = $1`, flaky.UUID); got != 1 {
		t.Fatalf("flaky effects = %d, want 1", got)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE event_id = $1`, broken.UUID); got != 0 {
		t.Fatalf("broken effects = %d, want 0 (rolled back each time)", got)
	}
	d := dead.snapshot()[0]
	if d.UUID != broken.UUID || !strings.Contains(d.Metadata.Get(middleware.ReasonForPoisonedKey), "broken for good") {
		t.Fatalf("dead letter %s, reason %q", d.UUID, d.Metadata.Get(middleware.ReasonForPoisonedKey))
	}
}
