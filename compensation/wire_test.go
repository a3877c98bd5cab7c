package compensation_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

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

// kafkaSubscriber is a kafka.Subscriber on brokers in a group of its own,
// closed when the test ends.
func kafkaSubscriber(t testing.TB, brokers []string) *kafka.Subscriber {
	t.Helper()
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Group()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

// runBatched runs p.RunBatched with cfg until the test ends, and checks
// that it then returns nil.
func runBatched(t *testing.T, p *compensation.Participant, cfg compensation.RunConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.RunBatched(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func kafkaPublisher(t testing.TB, brokers []string) *kafka.Publisher {
	t.Helper()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// handBuilt is a command as a participant in another language would see
// it: the header names are spelled out, not taken from millrace's
// constants, so this test pins the wire protocol.
func handBuilt(replyTo, sagaID, step, operation, attempt, command, payload string) *message.Message {
	msg := message.NewMessage(uuid.NewString(), []byte(payload))
	msg.Metadata.Set("saga_id", sagaID)
	msg.Metadata.Set("saga_type", "order")
	msg.Metadata.Set("saga_step", step)
	msg.Metadata.Set("saga_attempt", attempt)
	msg.Metadata.Set("saga_operation", operation)
	msg.Metadata.Set("saga_command", command)
	msg.Metadata.Set("saga_reply_topic", replyTo)
	msg.Metadata.Set("partition_key", sagaID)
	return msg
}

// The wire protocol end to end through the Kafka protocol, with
// hand-built Watermill messages only: commands published to a topic, a
// Router wired by hand (PoisonQueue, Retry, dedup, Handle), replies through
// the outbox and the relay, read back from the reply topic. Covers a
// success, a duplicate attempt, an empty compensation, a late action, a
// compensation, a business failure and a poisoned command.
//
// A poisoned command whose saga headers are usable (an unknown command)
// is also answered, with a failure whose reason begins "poisoned: ".
//
// Then the same through RunBatched, many commands per transaction.
func TestWireProtocolHandBuiltMessagesThroughKafka(t *testing.T) {
	t.Parallel()
	t.Run("router", func(t *testing.T) { t.Parallel(); wireProtocol(t, false) })
	t.Run("batched", func(t *testing.T) { t.Parallel(); wireProtocol(t, true) })
}

func wireProtocol(t *testing.T, batched bool) {
	b := setup(t, 8)
	brokers := kafkatest.Brokers(t)
	cmdTopic, poisonTopic := kafkatest.Topic(), kafkatest.Topic()
	replyTo := kafkatest.Topic()
	pub := kafkaPublisher(t, brokers)
	b.setFailAction(func(call compensation.Call) error {
		if call.SagaID == "saga-fail" {
			return compensation.Fail("insufficient credit")
		}
		return nil
	})

	const pay = `{"account":"a-1","amount":40}`
	cmds := []*message.Message{
		handBuilt(replyTo, "saga-ok", "credit", "action", "1", "reserve_credit", pay),
		handBuilt(replyTo, "saga-ok", "credit", "action", "2", "reserve_credit", pay), // a new attempt
		handBuilt(replyTo, "saga-late", "credit", "compensation", "1", "reserve_credit", pay),
		handBuilt(replyTo, "saga-late", "credit", "action", "1", "reserve_credit", pay), // late
		handBuilt(replyTo, "saga-undo", "credit", "action", "1", "reserve_credit", pay),
		handBuilt(replyTo, "saga-undo", "credit", "compensation", "1", "reserve_credit", pay),
		handBuilt(replyTo, "saga-fail", "credit", "action", "1", "reserve_credit", pay),
	}
	bad := handBuilt(replyTo, "saga-bad", "credit", "action", "1", "no_such_command", pay)
	for _, m := range append(cmds, bad, cmds[0]) { // cmds[0] twice: the same message redelivered
		if err := pub.Publish(cmdTopic, m); err != nil {
			t.Fatal(err)
		}
	}

	if batched {
		runBatched(t, b.p, compensation.RunConfig{Subscriber: kafkaSubscriber(t, brokers), Topic: cmdTopic, Poison: pub, PoisonTopic: poisonTopic})
	} else {
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		pq, err := middleware.PoisonQueueWithFilter(pub, poisonTopic, core.IsPermanent)
		if err != nil {
			t.Fatal(err)
		}
		retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond, ShouldRetry: inbox.ShouldRetry}
		router.AddConsumerHandler("payments", cmdTopic, kafkatest.NewSubscriber(t, brokers), b.p.Handle).
			AddMiddleware(pq, retry.Middleware)
		startRouter(t, router)
	}

	relay, err := outbox.NewRelay(b.db.Pool, outbox.RelayConfig{Schema: b.db.Schema, Publisher: pub, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-relayDone })

	// One reply per distinct command, the poisoned one too (a failure:
	// nothing ran): the redelivery is a duplicate.
	want := len(cmds) + 1
	replies := kafkatest.Read(t, brokers, replyTo, want)
	type key struct{ saga, op, attempt string }
	got := map[key]*message.Message{}
	for _, r := range replies {
		md := r.Metadata
		command := "reserve_credit"
		if md.Get("saga_id") == "saga-bad" {
			command = "no_such_command"
		}
		if md.Get("partition_key") != md.Get("saga_id") || md.Get("saga_type") != "order" || md.Get("saga_step") != "credit" ||
			md.Get("saga_command") != command {
			t.Fatalf("reply headers %v: want the command's saga id (also as key), type, step and command", md)
		}
		got[key{md.Get("saga_id"), md.Get("saga_operation"), md.Get("saga_attempt")}] = r
	}
	wantReplies := []struct {
		k                       key
		outcome, reason, inBody string
	}{
		{key{"saga-ok", "action", "1"}, "success", "", `"reservation_id"`},
		{key{"saga-ok", "action", "2"}, "success", "", `"reservation_id"`},
		{key{"saga-late", "compensation", "1"}, "success", "", `{}`},
		{key{"saga-late", "action", "1"}, "cancelled", "compensated before the action arrived", `{}`},
		{key{"saga-undo", "action", "1"}, "success", "", `"reservation_id"`},
		{key{"saga-undo", "compensation", "1"}, "success", "", `{}`},
		{key{"saga-fail", "action", "1"}, "failure", "insufficient credit", `{}`},
		{key{"saga-bad", "action", "1"}, "failure", "poisoned: compensation: unknown command", `{}`},
	}
	for _, w := range wantReplies {
		r := got[w.k]
		if r == nil {
			t.Fatalf("no reply for %+v among %d replies", w.k, len(replies))
		}
		if o, reason := r.Metadata.Get("saga_outcome"), r.Metadata.Get("saga_reason"); o != w.outcome || !strings.HasPrefix(reason, w.reason) ||
			(w.reason == "") != (reason == "") || !strings.Contains(string(r.Payload), w.inBody) {
			t.Fatalf("reply %+v: outcome %q reason %q payload %s; want %q %q %s", w.k, o, reason, r.Payload, w.outcome, w.reason, w.inBody)
		}
	}
	if string(got[key{"saga-ok", "action", "1"}].Payload) != string(got[key{"saga-ok", "action", "2"}].Payload) {
		t.Fatal("the two attempts' replies differ")
	}
	poisoned := kafkatest.Read(t, brokers, poisonTopic, 1)
	if poisoned[0].UUID != bad.UUID || !strings.Contains(poisoned[0].Metadata.Get(middleware.ReasonForPoisonedKey), "unknown command") {
		t.Fatalf("poisoned %s: %q", poisoned[0].UUID, poisoned[0].Metadata.Get(middleware.ReasonForPoisonedKey))
	}
	if n := b.actionCalls.Load(); n != 3 {
		t.Fatalf("actions ran %d times, want 3 (ok, undo, fail)", n)
	}
	// The poisoned attempt is a failure in the barrier: requeued once the
	// command is known, it would be answered with that failure, not run.
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier WHERE saga_id = 'saga-bad' AND outcome = 'failure' AND attempt = 1 AND reason LIKE 'poisoned: %'`); n != 1 {
		t.Fatalf("barrier rows of the poisoned attempt: %d", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.effect); n != 3 {
		t.Fatalf("effects = %d, want 3 (reserve ok, reserve undo, release undo)", n)
	}
	// No reply beyond one per distinct command.
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.outbox_event WHERE topic = $1`, replyTo); n != want {
		t.Fatalf("replies written = %d, want %d", n, want)
	}
}

// AddToRouter wires PoisonQueue and Retry around Handle: a bad command of
// each kind is poisoned with its reason, and only those whose saga headers
// are usable are answered (a failure); good commands are answered once
// each, a redelivery not again.
func TestAddToRouterPoisonsBadCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64, Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.p.AddToRouter(router, compensation.RouterConfig{Topic: "credit"}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no subscriber: %v, want ErrConfig", err)
	}
	if _, err := b.p.AddToRouter(router, compensation.RouterConfig{Topic: "credit", Subscriber: ps}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no poison publisher: %v, want ErrConfig", err)
	}
	if _, err := b.p.AddToRouter(router, compensation.RouterConfig{Topic: "credit", Subscriber: ps, Poison: ps}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var poisoned []*message.Message
	router.AddConsumerHandler("poison-reader", "credit.poison", ps, func(m *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		poisoned = append(poisoned, m)
		return nil
	})
	startRouter(t, router)

	saga := uuid.NewString()
	good := action(saga, 1)
	bads := map[string]*message.Message{}
	mk := func(reason string, edit func(m *message.Message)) {
		m := action(uuid.NewString(), 1)
		edit(m)
		m.Metadata.Set("test_case", reason)
		bads[m.UUID] = m
	}
	mk("missing saga id", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaID, "") })
	mk("NUL in step", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaStep, "a\x00b") })
	mk("invalid UTF-8 saga id", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaID, "\xff\xfe") })
	mk("bad operation", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaOperation, "undo") })
	mk("bad attempt", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaAttempt, "0") })
	mk("no reply topic", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaReplyTopic, "") })
	mk("unknown command", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaCommand, "nope") })
	mk("bad payload", func(m *message.Message) { m.Payload = []byte(`{"amount":"forty"}`) })
	mk("long saga id", func(m *message.Message) { m.Metadata.Set(core.MetadataSagaID, strings.Repeat("x", 201)) })
	all := []*message.Message{good}
	for _, m := range bads {
		all = append(all, m)
	}
	all = append(all, good.Copy())
	if err := ps.Publish("credit", all...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the poisoned commands", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(poisoned) == len(bads)
	})
	mu.Lock()
	for _, p := range poisoned {
		if bads[p.UUID] == nil {
			t.Fatalf("poisoned %s, a good command", p.UUID)
		}
		reason := p.Metadata.Get(middleware.ReasonForPoisonedKey)
		if !strings.Contains(reason, p.UUID) || !(strings.Contains(reason, "invalid command") || strings.Contains(reason, "unknown command")) {
			t.Fatalf("poison reason %q does not say what and which", reason)
		}
	}
	mu.Unlock()
	// The good command's reply, and a failure each for the unknown command
	// and the bad payload, whose saga headers are usable: their attempts'
	// failures are in the barrier. The others write nothing.
	replies := 3
	waitFor(t, 30*time.Second, "the good command's replies", func() bool { return len(b.replies(t, saga)) == 1 })
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier`); n != 3 {
		t.Fatalf("barrier rows = %d, want 3 (the good command's, and the failures of the two answered)", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier WHERE outcome = 'failure' AND reason LIKE 'poisoned: %'`); n != 2 {
		t.Fatalf("barrier failures of poisoned attempts = %d, want 2", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.outbox_event`); n != replies {
		t.Fatalf("outbox rows = %d, want %d", n, replies)
	}
	if n := b.actionCalls.Load(); n != 1 {
		t.Fatalf("action ran %d times, want 1", n)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	for _, cfg := range []compensation.Config{{}, {Name: "x", Schema: "Bad;"}} {
		if _, err := compensation.NewParticipant(b.db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := compensation.NewParticipant(nil, compensation.Config{Name: "x"}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nil pool: %v", err)
	}
	if err := compensation.Register(b.p, "reserve_credit", b.reserve, nil); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("registered twice: %v", err)
	}
	if err := compensation.Register[struct{}, struct{}](b.p, "x", nil, nil); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nil action: %v", err)
	}
	if err := compensation.Register(b.p, "", b.reserve, nil); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("empty name: %v", err)
	}
}
