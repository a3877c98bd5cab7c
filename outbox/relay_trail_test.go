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
// lock statement), its questions whether there is any in a round trip of
// their own (speculative looks that ask first), and all its round trips
// (a statement or a batch each).
type looks struct {
	lockLanes, claimableLanes string
	n, asked, trips           atomic.Int64
}

func (l *looks) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.trips.Add(1)
	if d.SQL == l.claimableLanes {
		l.asked.Add(1)
	}
	return ctx
}
func (l *looks) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *looks) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	l.trips.Add(1)
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
// for work about once per event: the look the NOTIFY wakes finds it, and
// its COMMIT's round trip asks whether there is more; the short looks
// after (worker 0's alone, from 4ms) ask first whether anything is
// claimable, a round trip without a transaction. Before they asked, the
// same trickle cost three looks per event (4.9 with every worker looking
// again from 1ms), each look that finds nothing two round trips. Every
// event still goes out.
func TestTrickleIsLookedForByOneWorker(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tracer, w, published := runTracedRelay(ctx, t)

	const events = 100
	before, askedBefore, tripsBefore := tracer.n.Load(), tracer.asked.Load(), tracer.trips.Load()
	for i := range events {
		if _, err := w.Write(ctx, Event{Topic: "trickle", PartitionKey: "k" + strconv.Itoa(i%7), Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitPublished(t, published, events)
	got, asked := tracer.n.Load()-before, tracer.asked.Load()-askedBefore
	trips := float64(tracer.trips.Load()-tripsBefore) / events
	t.Logf("%d looks and %d questions for %d events written 5ms apart: %.2f round trips per event", got, asked, events, trips)
	if per := float64(got) / events; per > maxLooksPerEvent {
		t.Errorf("%.2f looks per event; want at most %.2f", per, maxLooksPerEvent)
	}
	if trips > maxTripsPerEvent {
		t.Errorf("%.2f round trips per event to look for them; want at most %.2f", trips, maxTripsPerEvent)
	}
}

// Under a steady flow of events the relay looks again at once after a
// batch, on the answer its COMMIT's round trip brought, and asks nothing
// in a round trip of its own: that would be a round trip more per batch.
func TestSteadyFlowIsLookedForWithoutQuestions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tracer, w, published := runTracedRelay(ctx, t)

	// Four writers back to back: events come faster than a batch goes out.
	const writers, each = 4, 300
	before, askedBefore := tracer.n.Load(), tracer.asked.Load()
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				if _, err := w.Write(ctx, Event{Topic: "flow", PartitionKey: "k" + strconv.Itoa(g*each+i), Payload: []byte(`{}`)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	got, asked := tracer.n.Load()-before, tracer.asked.Load()-askedBefore
	waitPublished(t, published, writers*each)
	t.Logf("%d looks and %d questions while %d events were written", got, asked, writers*each)
	if per := float64(asked) / float64(got); per > maxQuestionsPerLook {
		t.Errorf("%.2f questions per look under a steady flow; want at most %.2f", per, maxQuestionsPerLook)
	}
}

// maxQuestionsPerLook (questions in a round trip of their own): 0.01-0.02
// measured on an idle machine and 0.01-0.08 under -race since a batch asks
// for more in its COMMIT's round trip (the questions of the timer's
// looks); 0.23-0.36 when the question after a batch was a round trip of
// its own; 0.76-0.78 when every look again at once asked, on an idle
// machine.
const maxQuestionsPerLook = 0.6

// maxLooksPerEvent: 1.02-1.04 measured on an idle machine, 1.5-1.7 under
// -race beside a CI run, once the looks that nothing announced ask first:
// 3.0 looks per event before, on an idle machine (4.9 with every worker
// looking again from 1ms).
const maxLooksPerEvent = 2.4

// maxTripsPerEvent, counted as the relay's statements and batches: 3.3-3.7
// on an idle machine and 3.7-4.1 under -race since a batch asks for more
// in its COMMIT's round trip (a look, its COMMIT with the question, and
// about one short look's question per event); 4.2-4.3 on an idle machine
// when the question after a batch was a round trip of its own; about 6
// before the questions (three looks). The bound is for the questions: they
// must not multiply. TestBatchAsksForMoreWithItsCommit pins a batch's two
// round trips.
const maxTripsPerEvent = 6.0

// runTracedRelay runs a relay of two workers, on a pool traced by the
// returned looks, that records what it publishes (published says how many
// distinct events), until the test ends; and returns a Writer to the same
// outbox. It waits out the relay's first looks.
func runTracedRelay(ctx context.Context, t *testing.T) (tracer *looks, w *Writer, published func() int) {
	t.Helper()
	db := pgtest.New(t)
	probe, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}})
	if err != nil {
		t.Fatal(err)
	}
	tracer = &looks{lockLanes: probe.sql.lockLanes, claimableLanes: probe.sql.claimableLanes}
	pool, err := pgtest.ConnectTraced(ctx, pgtest.URL(), 6, tracer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var mu sync.Mutex
	seen := map[string]bool{}
	pub := publishFunc(func(_ string, ids ...string) {
		mu.Lock()
		for _, id := range ids {
			seen[id] = true
		}
		mu.Unlock()
	})
	r, err := NewRelay(pool, RelayConfig{Schema: db.Schema, Publisher: pub, Workers: 2, PollInterval: time.Second, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if w, err = NewWriter(db.Pool, WriterConfig{Schema: db.Schema}); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	time.Sleep(200 * time.Millisecond) // the start's looks
	return tracer, w, func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(seen)
	}
}

// waitPublished waits up to 10s until n events were published.
func waitPublished(t *testing.T, published func() int, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); published() < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events published", published(), n)
		}
	}
}

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
