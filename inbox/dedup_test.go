package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

func newDedup(t testing.TB, b *bundle, consumer string) *inbox.Deduplicator {
	t.Helper()
	d, err := inbox.NewDeduplicator(b.db.Pool, inbox.DedupConfig{Schema: b.db.Schema, Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// effectHandler writes one effect row with the middleware's transaction.
func (b *bundle) effectHandler(t testing.TB) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("no tx in context")
		}
		return nil, b.apply(msg.Context(), tx, msg.UUID, "")
	}
}

func TestDedupConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	if _, err := inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no consumer: %v, want ErrConfig", err)
	}
	if _, err := inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{Consumer: "c", Schema: "Bad;Schema"}); err == nil {
		t.Fatal("bad schema accepted")
	}
	if _, err := inbox.NewDeduplicator(nil, inbox.DedupConfig{Consumer: "c"}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("nil pool: %v", err)
	}
	for _, bad := range []string{`back\slash`, "nul\x00", "bad\xffutf8"} {
		if _, err := inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{Consumer: bad}); !errors.Is(err, core.ErrConfig) {
			t.Fatalf("consumer %q: %v, want ErrConfig", bad, err)
		}
	}
}

// Guarantee 5: 10,000 events, each delivered three times by four
// concurrent consumers, give exactly 10,000 effects.
func TestDedupEachEventOnceUnderConcurrentRedelivery(t *testing.T) {
	t.Parallel()
	const events, deliveries, workers = 10_000, 3, 4
	b := setup(t, workers+2)
	h := newDedup(t, b, "orders").Middleware(b.effectHandler(t))

	ids := make([]string, events)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	// Each worker walks all deliveries in its own order, so the copies of an
	// event race each other.
	var ran atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := w; i < events*deliveries; i += workers {
				id := ids[(i*7919)%events]
				msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
				msg.Metadata.Set(core.MetadataEventID, id)
				msg.UUID = id
				if _, err := h(msg); err != nil {
					errs <- err
					return
				}
				ran.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d deliveries in %v (%.0f/s)", ran.Load(), time.Since(start), float64(ran.Load())/time.Since(start).Seconds())
	if got := b.effects(t); got != events {
		t.Fatalf("effects = %d, want %d", got, events)
	}
	if got := b.distinctEffects(t); got != events {
		t.Fatalf("distinct effects = %d, want %d", got, events)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("processed_event")); got != events {
		t.Fatalf("marks = %d, want %d", got, events)
	}
}

// A handler that fails on the first delivery: its writes and the mark roll
// back, the redelivery applies the event once. Also through Watermill's
// Retry and PoisonQueue in the documented order.
func TestDedupFailedHandlerRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	d := newDedup(t, b, "c")
	var calls atomic.Int32
	failFirst := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		n := calls.Add(1)
		if err := b.apply(msg.Context(), tx, msg.UUID, fmt.Sprint("call ", n)); err != nil {
			return nil, err
		}
		if n == 1 {
			return nil, errors.New("transient")
		}
		return nil, nil
	}
	h := d.Middleware(failFirst)
	msg := message.NewMessage(uuid.NewString(), []byte(`{}`))
	if _, err := h(msg); err == nil || err.Error() != "transient" {
		t.Fatalf("first delivery: %v, want the handler's error", err)
	}
	if _, ok := core.TxFromContext(msg.Context()); ok {
		t.Fatal("the middleware left its transaction in the message context")
	}
	if got := b.effects(t); got != 0 {
		t.Fatalf("after the failure effects = %d, want 0 (rolled back)", got)
	}
	for range 2 { // the redelivery, and one more duplicate
		if _, err := h(msg.Copy()); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note = 'call 2'`); got != 1 || b.effects(t) != 1 || calls.Load() != 2 {
		t.Fatalf("effects = %d (call 2: %d), calls = %d; want one effect from the second call", b.effects(t), got, calls.Load())
	}

	// The same through PoisonQueue(Retry(dedup(handler))).
	calls.Store(0)
	poison := &recordingPublisher{}
	pq, err := middleware.PoisonQueueWithFilter(poison, "poison", core.IsPermanent)
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond, ShouldRetry: inbox.ShouldRetry}
	chain := pq(retry.Middleware(d.Middleware(failFirst)))
	msg2 := message.NewMessage(uuid.NewString(), []byte(`{}`))
	if _, err := chain(msg2); err != nil {
		t.Fatalf("chain: %v", err)
	}
	if calls.Load() != 2 || b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE event_id = $1`, msg2.UUID) != 1 {
		t.Fatalf("with Retry: calls = %d, effects for the message = %d; want 2 and 1", calls.Load(),
			b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE event_id = $1`, msg2.UUID))
	}
	if len(poison.msgs) != 0 {
		t.Fatal("a retried success went to the poison queue")
	}

	// A message without an id is not retried and is poisoned with its reason.
	calls.Store(0)
	bad := message.NewMessage("not-a-uuid", []byte(`{}`))
	if _, err := chain(bad); err != nil {
		t.Fatalf("chain(bad): %v", err)
	}
	if calls.Load() != 0 || len(poison.msgs) != 1 {
		t.Fatalf("no-id message: handler calls %d, poisoned %d; want 0 and 1", calls.Load(), len(poison.msgs))
	}
	if r := poison.msgs[0].Metadata.Get(middleware.ReasonForPoisonedKey); !strings.Contains(r, "no usable event id") || !strings.Contains(r, "not-a-uuid") {
		t.Fatalf("poison reason = %q", r)
	}
}

type recordingPublisher struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, msgs...)
	return nil
}
func (p *recordingPublisher) Close() error { return nil }

func TestDedupNoEventID(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	d := newDedup(t, b, "c")
	called := false
	h := d.Middleware(func(*message.Message) ([]*message.Message, error) { called = true; return nil, nil })
	for _, msg := range []*message.Message{
		message.NewMessage("", nil),
		message.NewMessage("x", nil),
		func() *message.Message {
			m := message.NewMessage(uuid.NewString(), nil)
			m.Metadata.Set(core.MetadataEventID, "garbage") // metadata wins and is bad
			return m
		}(),
	} {
		_, err := h(msg)
		if !errors.Is(err, inbox.ErrNoEventID) || !core.IsPermanent(err) {
			t.Fatalf("message %q: err = %v; want a permanent ErrNoEventID", msg.UUID, err)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", msg.UUID)) {
			t.Fatalf("error %q does not name the message", err)
		}
	}
	if called {
		t.Fatal("handler ran for a message without an id")
	}
	// A configured id function.
	d2, err := inbox.NewDeduplicator(b.db.Pool, inbox.DedupConfig{Schema: b.db.Schema, Consumer: "c2",
		EventID: func(m *message.Message) (string, error) { return m.Metadata.Get("my_id"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	h2 := d2.Middleware(b.effectHandler(t))
	for range 2 {
		m := message.NewMessage("whatever", nil)
		m.Metadata.Set("my_id", id)
		if _, err := h2(m); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("custom id: effects = %d, want 1", got)
	}
}

func TestDedupConsumersAreIndependent(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	billing := newDedup(t, b, "billing").Middleware(b.effectHandler(t))
	// A name with a quote in it: the mark's literal is quoted, not spliced.
	shipping := newDedup(t, b, "o'shipping'); DROP TABLE x; --").Middleware(b.effectHandler(t))
	id := uuid.NewString()
	for range 2 {
		for _, h := range []message.HandlerFunc{billing, shipping} {
			if _, err := h(message.NewMessage(id, nil)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := b.effects(t); got != 2 {
		t.Fatalf("effects = %d, want 2 (one per consumer)", got)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("processed_event")+` WHERE event_id = $1`, id); got != 2 {
		t.Fatalf("marks = %d, want 2", got)
	}
}

// The handler's returned messages pass through unchanged, and a duplicate
// returns none.
func TestDedupPassesProducedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	out := message.NewMessage(uuid.NewString(), []byte("out"))
	h := newDedup(t, b, "c").Middleware(func(*message.Message) ([]*message.Message, error) {
		return []*message.Message{out}, nil
	})
	id := uuid.NewString()
	got, err := h(message.NewMessage(id, nil))
	if err != nil || len(got) != 1 || got[0] != out {
		t.Fatalf("first: %v, %v", got, err)
	}
	got, err = h(message.NewMessage(id, nil))
	if err != nil || len(got) != 0 {
		t.Fatalf("duplicate: %v, %v", got, err)
	}
}

const (
	childSchemaEnv = "MILLRACE_INBOX_CHILD_SCHEMA"
	childEventEnv  = "MILLRACE_INBOX_CHILD_EVENT"
)

// TestHelperKilledChild is not a test: TestDedupProcessKilledMidHandler runs
// the test binary again with this test selected, and kills it.
func TestHelperKilledChild(t *testing.T) {
	schema := os.Getenv(childSchemaEnv)
	if schema == "" {
		t.Skip("helper process for TestDedupProcessKilledMidHandler")
	}
	pool, err := pgtest.Connect(context.Background(), pgtest.URL(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+sqlident.Table(schema, "effect")+` (event_id, note) VALUES ($1, 'child')`, msg.UUID); err != nil {
			return nil, err
		}
		childtest.Announce()
		select {} // blocked mid-handler until killed
	})
	_, _ = h(message.NewMessage(os.Getenv(childEventEnv), nil))
}

// A process killed mid-handler (after the mark and an effect were written,
// before commit): the redelivery applies the event once.
func TestDedupProcessKilledMidHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	id := uuid.NewString()
	// The child holds the mark, uncommitted, when it is killed.
	childtest.KillAtReady(t, "TestHelperKilledChild", []string{childSchemaEnv + "=" + b.db.Schema, childEventEnv + "=" + id}, 30*time.Second)

	h := newDedup(t, b, "c").Middleware(b.effectHandler(t))
	for range 2 {
		if _, err := h(message.NewMessage(id, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.effects(t); got != 1 {
		t.Fatalf("effects = %d, want 1", got)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note = 'child'`); got != 0 {
		t.Fatal("the killed child's effect committed")
	}
}
