package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

func newReceiver(t testing.TB, b *bundle, consumer string) *inbox.Receiver {
	t.Helper()
	r, err := inbox.NewReceiver(b.db.Pool, inbox.ReceiverConfig{Schema: b.db.Schema, Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func newProcessor(t testing.TB, b *bundle, cfg inbox.ProcessorConfig) *inbox.Processor {
	t.Helper()
	cfg.Schema = b.db.Schema
	if cfg.Consumer == "" {
		cfg.Consumer = "c"
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 5 * time.Millisecond
	}
	p, err := inbox.NewProcessor(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// run starts p.Run and stops it when the test ends, checking it returns nil.
func run(t testing.TB, p interface{ Run(context.Context) error }) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func msgs(n int, key func(i int) string) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = message.NewMessage(uuid.NewString(), fmt.Appendf(nil, `{"n":%d}`, i))
		if key != nil {
			out[i].Metadata.Set(core.MetadataPartitionKey, key(i))
		}
	}
	return out
}

func TestReceiverStoresOnceAndKeepsBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	bin := message.NewMessage(uuid.NewString(), []byte{0, 0xff, 'x', 0})
	bin.Metadata.Set("trace", "abc")
	bin.Metadata.Set(core.MetadataPartitionKey, "k1")
	if err := r.Handle(bin); err != nil {
		t.Fatal(err)
	}
	n, err := r.Receive(context.Background(), bin, message.NewMessage(uuid.NewString(), []byte(`{"a":1}`)))
	if err != nil || n != 1 {
		t.Fatalf("Receive = %d, %v; want 1 new (the other a duplicate)", n, err)
	}
	// Another consumer stores its own copy.
	if n, err := newReceiver(t, b, "other").Receive(context.Background(), bin); err != nil || n != 1 {
		t.Fatalf("other consumer: %d, %v", n, err)
	}
	var (
		payload []byte
		topic   string
		key     string
	)
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT payload, topic, partition_key FROM `+b.table("inbox_event")+` WHERE consumer = 'c' AND event_id = $1`, bin.UUID).Scan(&payload, &topic, &key); err != nil {
		t.Fatal(err)
	}
	if string(payload) != string(bin.Payload) || topic != "" || key != "k1" {
		t.Fatalf("stored payload %x topic %q key %q", payload, topic, key)
	}
	// The processor hands the message back as it came.
	var got *message.Message
	p := newProcessor(t, b, inbox.ProcessorConfig{Handler: func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
		if m.UUID == bin.UUID {
			got = m
		}
		if ctxTx, ok := core.TxFromContext(m.Context()); !ok || ctxTx != tx {
			return errors.New("the message context does not carry the batch tx")
		}
		return nil
	}})
	if n, err := p.ProcessOnce(context.Background()); err != nil || n != 2 {
		t.Fatalf("ProcessOnce = %d, %v", n, err)
	}
	if got == nil || string(got.Payload) != string(bin.Payload) || got.Metadata.Get("trace") != "abc" {
		t.Fatalf("handler got %+v", got)
	}
	// Without an id nothing of the call is stored.
	if _, err := r.Receive(context.Background(), message.NewMessage(uuid.NewString(), nil), message.NewMessage("nope", nil)); !errors.Is(err, inbox.ErrNoEventID) {
		t.Fatalf("Receive without id: %v", err)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")); got != 3 {
		t.Fatalf("rows = %d, want 3", got)
	}
}

// A burst of 50,000 messages is accepted faster than two processors drain
// it, and every message is applied exactly once.
func TestReceiverBurstTwoProcessors(t *testing.T) {
	t.Parallel()
	total := 50_000
	if testing.Short() {
		total = 10_000
	}
	const batch = 500
	b := setup(t, 10)
	r := newReceiver(t, b, "burst")
	all := msgs(total, func(i int) string { return fmt.Sprint("k", i%100) })

	// Accept the burst from 4 goroutines, batch by batch, as a consumer
	// reading 4 partitions would.
	start := time.Now()
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for w := range 4 {
		wg.Go(func() {
			for i := w * batch; i < total; i += 4 * batch {
				n, err := r.Receive(context.Background(), all[i:min(i+batch, total)]...)
				if err != nil {
					t.Error(err)
					return
				}
				accepted.Add(int64(n))
			}
		})
	}
	wg.Wait()
	acceptDur := time.Since(start)
	if accepted.Load() != int64(total) {
		t.Fatalf("accepted %d, want %d", accepted.Load(), total)
	}
	// Redeliver a slice of it: ignored.
	if n, err := r.Receive(context.Background(), all[:batch]...); err != nil || n != 0 {
		t.Fatalf("redelivery stored %d, %v", n, err)
	}

	var handled atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
		handled.Add(1)
		return b.apply(ctx, tx, m.UUID, "")
	}
	start = time.Now()
	run(t, newProcessor(t, b, inbox.ProcessorConfig{Consumer: "burst", Handler: handler}))
	run(t, newProcessor(t, b, inbox.ProcessorConfig{Consumer: "burst", Handler: handler}))
	unprocessed := `SELECT count(*) FROM ` + b.table("inbox_event") + ` WHERE consumer = 'burst' AND NOT processed`
	waitFor(t, 80*time.Second, "the burst to drain", func() bool { return b.count(t, unprocessed) == 0 })
	drainDur := time.Since(start)
	acceptRate, drainRate := float64(total)/acceptDur.Seconds(), float64(total)/drainDur.Seconds()
	t.Logf("accepted %d in %v (%.0f msg/s); two processors drained them in %v (%.0f msg/s)", total, acceptDur, acceptRate, drainDur, drainRate)
	if acceptRate <= drainRate {
		t.Errorf("accept rate %.0f/s is not above the drain rate %.0f/s", acceptRate, drainRate)
	}
	if got := b.effects(t); got != total {
		t.Fatalf("effects = %d, want %d", got, total)
	}
	if got := b.distinctEffects(t); got != total {
		t.Fatalf("distinct effects = %d, want %d", got, total)
	}
	if handled.Load() != int64(total) {
		t.Fatalf("handler ran %d times, want %d", handled.Load(), total)
	}
}

// Failures: attempts, last_error and backoff; a handler's writes of a failed
// attempt roll back while the rest of the batch commits; dead after
// MaxAttempts (or at once for a permanent error); list, requeue, discard.
func TestProcessorFailuresAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	r := newReceiver(t, b, "c")
	ms := msgs(5, nil)
	if _, err := r.Receive(context.Background(), ms...); err != nil {
		t.Fatal(err)
	}
	flaky, permanent := ms[1].UUID, ms[3].UUID
	var fixed atomic.Bool
	var onError atomic.Int32
	p := newProcessor(t, b, inbox.ProcessorConfig{
		MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond,
		OnError: func(*message.Message, int, error) { onError.Add(1) },
		Handler: func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
			if err := b.apply(ctx, tx, m.UUID, ""); err != nil {
				return err
			}
			switch {
			case m.UUID == flaky && !fixed.Load():
				return errors.New("downstream unavailable")
			case m.UUID == permanent:
				return core.Permanent(errors.New("malformed order"))
			}
			return nil
		},
	})
	ctx := context.Background()
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.effects(t); got != 3 {
		t.Fatalf("after one batch effects = %d, want 3 (the failures rolled back to their savepoints)", got)
	}
	var attempts int
	var lastErr string
	if err := b.db.Pool.QueryRow(ctx, `SELECT attempts, last_error FROM `+b.table("inbox_event")+` WHERE event_id = $1`, flaky).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || lastErr != "downstream unavailable" {
		t.Fatalf("flaky row: attempts %d, last_error %q", attempts, lastErr)
	}
	// Permanent: dead at once. Flaky: dead after three attempts.
	waitFor(t, 10*time.Second, "the flaky row to die", func() bool {
		if _, err := p.ProcessOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE dead_at IS NOT NULL`) == 2
	})
	if onError.Load() != 4 {
		t.Fatalf("OnError called %d times, want 4 (3 flaky + 1 permanent)", onError.Load())
	}
	dead, err := p.DeadLetters().List(ctx, core.ListParams{Limit: 10})
	if err != nil || len(dead) != 2 {
		t.Fatalf("List = %v, %v", dead, err)
	}
	byID := map[string]inbox.DeadLetter{dead[0].EventID: dead[0], dead[1].EventID: dead[1]}
	if d := byID[permanent]; d.Attempts != 1 || d.LastError != "malformed order" {
		t.Fatalf("permanent dead letter: %+v", d)
	}
	if d := byID[flaky]; d.Attempts != 3 || d.LastError != "downstream unavailable" || string(d.Payload) != string(ms[1].Payload) {
		t.Fatalf("flaky dead letter: %+v", d)
	}
	// Dead rows are not claimed.
	if n, err := p.ProcessOnce(ctx); err != nil || n != 0 {
		t.Fatalf("ProcessOnce over dead rows = %d, %v", n, err)
	}
	// Requeue the flaky one after the fix; discard the permanent one.
	fixed.Store(true)
	if n, err := p.DeadLetters().Requeue(ctx, opsActor, flaky); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	if n, err := p.DeadLetters().Requeue(ctx, opsActor, flaky); err != nil || n != 0 {
		t.Fatalf("second Requeue = %d, %v; want 0 (no longer dead), nil", n, err)
	}
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p.DeadLetters().DiscardTx(ctx, tx, opsActor, permanent); err != nil || n != 1 {
		t.Fatalf("DiscardTx = %d, %v", n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := p.ProcessOnce(ctx); err != nil || n != 1 {
		t.Fatalf("ProcessOnce after requeue = %d, %v", n, err)
	}
	if got := b.effects(t); got != 4 {
		t.Fatalf("effects = %d, want 4 (the discarded one never applied)", got)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE NOT processed`); got != 0 {
		t.Fatalf("%d rows left unprocessed", got)
	}
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE discarded_at IS NOT NULL AND event_id = $1`, permanent); got != 1 {
		t.Fatal("discarded row not marked discarded")
	}
	if dead, err := p.DeadLetters().List(ctx, core.ListParams{}); err != nil || len(dead) != 0 {
		t.Fatalf("List after = %v, %v", dead, err)
	}
}

// With OrderByKey, a key's rows are applied in arrival order with two
// processors, and a key whose row fails waits while other keys flow.
func TestProcessorOrderByKey(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	r := newReceiver(t, b, "c")
	const keys, perKey = 20, 50
	all := msgs(keys*perKey, func(i int) string { return fmt.Sprint("k", i%keys) })
	for i := 0; i < len(all); i += 100 {
		if _, err := r.Receive(context.Background(), all[i:i+100]...); err != nil {
			t.Fatal(err)
		}
	}
	blocker := all[2*keys+3].UUID // key k3, its third row
	var release atomic.Bool
	var mu sync.Mutex
	seen := map[string][]string{}
	handler := func(ctx context.Context, tx pgx.Tx, m *message.Message) error {
		if m.UUID == blocker && !release.Load() {
			return errors.New("not yet")
		}
		if err := b.apply(ctx, tx, m.UUID, m.Metadata.Get(core.MetadataPartitionKey)); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		k := m.Metadata.Get(core.MetadataPartitionKey)
		seen[k] = append(seen[k], m.UUID) // a rolled-back batch may record twice; see below
		return nil
	}
	cfg := inbox.ProcessorConfig{Handler: handler, OrderByKey: true, BatchSize: 37, RetryMin: time.Millisecond, RetryMax: time.Millisecond, MaxAttempts: 1000}
	run(t, newProcessor(t, b, cfg))
	run(t, newProcessor(t, b, cfg))
	effects := func() int { return b.effects(t) }
	waitFor(t, 30*time.Second, "every other key to drain", func() bool { return effects() == keys*perKey-(perKey-2) })
	if got := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE note = 'k3'`); got != 2 {
		t.Fatalf("key k3 applied %d rows while its third failed; want 2", got)
	}
	release.Store(true)
	waitFor(t, 30*time.Second, "k3 to drain", func() bool { return effects() == keys*perKey })
	// Commit order per key equals arrival order: compare the effect table's
	// insertion order (ctid is not reliable; use the xmin order of commits
	// via the handler's record, which only counts committed batches if no
	// batch rolled back; with no errors besides the blocker, none did).
	mu.Lock()
	defer mu.Unlock()
	for k := range keys {
		key := fmt.Sprint("k", k)
		var want []string
		for i := k; i < len(all); i += keys {
			want = append(want, all[i].UUID)
		}
		got := seen[key]
		if len(got) != len(want) {
			t.Fatalf("key %s: handled %d, want %d", key, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("key %s: position %d is %s, want %s", key, i, got[i], want[i])
			}
		}
	}
}

func TestProcessorConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	h := func(context.Context, pgx.Tx, *message.Message) error { return nil }
	for _, cfg := range []inbox.ProcessorConfig{
		{Handler: h},
		{Consumer: "c"},
		{Consumer: "c", Handler: h, BatchSize: -1},
		{Consumer: "c", Handler: h, RetryMin: time.Minute, RetryMax: time.Second},
	} {
		if _, err := inbox.NewProcessor(b.db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := inbox.NewReceiver(b.db.Pool, inbox.ReceiverConfig{}); !errors.Is(err, core.ErrConfig) {
		t.Errorf("receiver without consumer: %v", err)
	}
}
