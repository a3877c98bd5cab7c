package outbox

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
)

// looks counts the relay's looks for work (batches that carry its lane
// lock statement).
type looks struct {
	lockLanes string
	n         atomic.Int64
}

func (l *looks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (l *looks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *looks) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	for _, q := range d.Batch.QueuedQueries {
		if q.SQL == l.lockLanes {
			l.n.Add(1)
			break
		}
	}
	return ctx
}
func (l *looks) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (l *looks) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// Under a trickle of events, each announced by its NOTIFY, the relay looks
// about three times per event: the look that finds it, the look again at
// once, and one short look after (worker 0's alone, from 4ms). With every
// worker looking again from 1ms, the same trickle cost 4.9 looks per
// event, each look that finds nothing a round trip. Every event still
// goes out.
func TestTrickleIsLookedForByOneWorker(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	probe, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}})
	if err != nil {
		t.Fatal(err)
	}
	tracer := &looks{lockLanes: probe.lockLanes}
	pool, err := pgtest.ConnectTraced(ctx, pgtest.URL(), 6, tracer)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var mu sync.Mutex
	published := map[string]bool{}
	pub := publishFunc(func(_ string, ids ...string) {
		mu.Lock()
		for _, id := range ids {
			published[id] = true
		}
		mu.Unlock()
	})
	r, err := NewRelay(pool, RelayConfig{Schema: db.Schema, Publisher: pub, Workers: 2, PollInterval: time.Second, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(db.Pool, WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { stop(); <-done }()
	time.Sleep(200 * time.Millisecond) // the start's looks

	const events = 100
	before := tracer.n.Load()
	for i := range events {
		if _, err := w.Write(ctx, Event{Topic: "trickle", PartitionKey: "k" + strconv.Itoa(i%7), Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(published)
		mu.Unlock()
		if n == events {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events published", n, events)
		}
	}
	got := tracer.n.Load() - before
	t.Logf("%d looks for %d events written 5ms apart", got, events)
	if per := float64(got) / events; per > maxLooksPerEvent {
		t.Errorf("%.1f looks per event; want at most %.1f", per, maxLooksPerEvent)
	}
}

// maxLooksPerEvent: 3.0 measured, 4.9 before.
const maxLooksPerEvent = 3.6

// publishFunc publishes by calling itself with the messages' UUIDs.
type publishFunc func(topic string, ids ...string)

func (f publishFunc) Publish(topic string, msgs ...*message.Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.UUID
	}
	f(topic, ids...)
	return nil
}
func (publishFunc) Close() error { return nil }
