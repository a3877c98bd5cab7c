package outbox_test

import (
	"context"
	"encoding/json"
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

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// recorder is a Watermill publisher that keeps what it is sent. fail, when
// set, decides per message whether it fails; batchErrors makes it report
// failures as a *core.BatchError like the Kafka publisher, otherwise it
// fails the whole call like a plain Watermill publisher.
type recorder struct {
	mu          sync.Mutex
	msgs        []*message.Message
	fail        func(*message.Message) error
	batchErrors bool
	calls       atomic.Int64
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.calls.Add(1)
	return r.publish(topic, msgs)
}

func (r *recorder) publish(topic string, msgs []*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var be core.BatchError
	failedKeys := map[string]bool{}
	for _, m := range msgs {
		key := m.Metadata.Get(core.MetadataPartitionKey)
		if r.batchErrors && failedKeys[key] {
			// Like the Kafka publisher: nothing of a key goes out after a
			// failed message of that key.
			be.Errors = append(be.Errors, core.MessageError{UUID: m.UUID, Err: errors.New("held")})
			continue
		}
		if r.fail != nil {
			if err := r.fail(m); err != nil {
				if !r.batchErrors {
					return err
				}
				failedKeys[key] = true
				be.Errors = append(be.Errors, core.MessageError{UUID: m.UUID, Err: err})
				continue
			}
		}
		m.Metadata.Set("topic", topic)
		r.msgs = append(r.msgs, m)
	}
	if len(be.Errors) > 0 {
		return &be
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) setFail(f func(*message.Message) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = f
}

func (r *recorder) snapshot() []*message.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*message.Message(nil), r.msgs...)
}

func (r *recorder) ids() map[string]int {
	out := map[string]int{}
	for _, m := range r.snapshot() {
		out[m.UUID]++
	}
	return out
}

// startRelay runs a relay until the test ends (or stop is called) and
// checks that Run returned.
func startRelay(t *testing.T, db *pgtest.DB, cfg outbox.RelayConfig) (stop func()) {
	t.Helper()
	cfg.Schema = db.Schema
	r, err := outbox.NewRelay(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Relay.Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("Relay.Run did not return within 30s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func writeN(t *testing.T, w *outbox.Writer, topic string, n, keys int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	const chunk = 1000
	for start := 0; start < n; start += chunk {
		events := make([]outbox.Event, 0, chunk)
		for i := start; i < min(n, start+chunk); i++ {
			events = append(events, outbox.Event{
				Topic:        topic,
				PartitionKey: fmt.Sprintf("key-%d", i%keys),
				EventType:    "Counted",
				Payload:      fmt.Appendf(nil, `{"seq":%d}`, i),
			})
		}
		got, err := w.Write(context.Background(), events...)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

func TestNewRelayValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 1})
	for name, cfg := range map[string]outbox.RelayConfig{
		"no publisher":  {},
		"bad schema":    {Publisher: &recorder{}, Schema: "Bad-Schema"},
		"bad batch":     {Publisher: &recorder{}, BatchSize: -1},
		"bad attempts":  {Publisher: &recorder{}, MaxAttempts: -2},
		"bad retry":     {Publisher: &recorder{}, RetryMin: time.Minute, RetryMax: time.Second},
		"too many lane": {Publisher: &recorder{}, LanesPerBatch: outbox.Lanes + 1},
	} {
		if _, err := outbox.NewRelay(db.Pool, cfg); err == nil {
			t.Errorf("%s: NewRelay accepted %+v", name, cfg)
		}
	}
}

func TestRelayPublishesEverythingWithMetadata(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	ids := writeN(t, w, "counted", 2500, 10)
	bin, err := w.Write(context.Background(), outbox.Event{Topic: "blobs", PartitionKey: "b", AggregateType: "Blob", AggregateID: "b-1",
		Payload: []byte{0xde, 0xad}, Binary: true, Metadata: map[string]string{"traceparent": "00-1-2-01"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec})
	eventually(t, 30*time.Second, "all events published", func() bool { return len(rec.ids()) == 2501 })
	got := rec.ids()
	for _, id := range append(ids, bin...) {
		if got[id] != 1 {
			t.Fatalf("event %s published %d times", id, got[id])
		}
	}
	for _, m := range rec.snapshot() {
		if m.UUID != bin[0] {
			continue
		}
		md := m.Metadata
		if string(m.Payload) != "\xde\xad" || md.Get(core.MetadataContentType) != core.ContentTypeBinary ||
			md.Get("traceparent") != "00-1-2-01" || md.Get(core.MetadataAggregateID) != "b-1" ||
			md.Get(core.MetadataEventID) != bin[0] || md.Get(core.MetadataPartitionKey) != "b" || md.Get("topic") != "blobs" {
			t.Fatalf("binary event arrived as payload %x metadata %v", m.Payload, md)
		}
	}
	eventually(t, 10*time.Second, "pending set empty", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	if n := countRows(t, db, "outbox_event", "published_at IS NULL"); n != 0 {
		t.Fatalf("%d events not marked published", n)
	}
}

// A transaction holding a lower id that commits after later ones is still
// published: claims go by state, not by a cursor over ids.
func TestRelayPublishesLateCommitWithLowerID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	rec := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, PollInterval: 20 * time.Millisecond})

	slow, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(ctx) //nolint:errcheck
	lowID, err := w.WriteTx(ctx, slow, outbox.Event{Topic: "t", PartitionKey: "slow", Payload: []byte(`{"slow":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	later := writeN(t, w, "t", 50, 5)
	eventually(t, 10*time.Second, "later events published", func() bool { return len(rec.ids()) == 50 })
	if rec.ids()[lowID[0]] != 0 {
		t.Fatal("uncommitted event was published")
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "late-committed event published", func() bool { return rec.ids()[lowID[0]] == 1 })
	var lowRow, highRow int64
	db.Pool.QueryRow(ctx, `SELECT id FROM "`+db.Schema+`".outbox_event WHERE event_id = $1`, lowID[0]).Scan(&lowRow)  //nolint:errcheck
	db.Pool.QueryRow(ctx, `SELECT id FROM "`+db.Schema+`".outbox_event WHERE event_id = $1`, later[0]).Scan(&highRow) //nolint:errcheck
	if lowRow >= highRow {
		t.Fatalf("test did not set up a lower id committing late: %d >= %d", lowRow, highRow)
	}
}

func TestRelayRetriesThenDeadLettersAndHoldsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, batchErrors := range []bool{true, false} {
		t.Run(fmt.Sprintf("batchErrors=%v", batchErrors), func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			w := newWriter(t, db)
			poison, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "bad", Payload: []byte(`{"poison":true}`)})
			if err != nil {
				t.Fatal(err)
			}
			behind, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "bad", Payload: []byte(`{"behind":true}`)})
			if err != nil {
				t.Fatal(err)
			}
			others := writeN(t, w, "t", 300, 30)
			rec := &recorder{batchErrors: batchErrors}
			rec.setFail(func(m *message.Message) error {
				if m.UUID == poison[0] {
					return core.Permanent(errors.New("message too large"))
				}
				return nil
			})
			startRelay(t, db, outbox.RelayConfig{Publisher: rec, MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond})
			eventually(t, 20*time.Second, "others published", func() bool {
				got := rec.ids()
				for _, id := range others {
					if got[id] == 0 {
						return false
					}
				}
				return true
			})
			// A permanent failure dead-letters at once: one attempt, not MaxAttempts.
			eventually(t, 20*time.Second, "poison dead-lettered", func() bool {
				return countRows(t, db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%too large%'") == 1
			})
			if n := countRows(t, db, "outbox_pending", "dead AND blocked"); n != 1 {
				t.Fatalf("%d dead pending rows, want 1", n)
			}
			got := rec.ids()
			if got[poison[0]] != 0 || got[behind[0]] != 0 {
				t.Fatalf("poison published %d times, the event behind it %d times; want 0 and 0 (it waits)", got[poison[0]], got[behind[0]])
			}
			// Requeue (as the Admin API does) once the publisher accepts it: both
			// go out, in order.
			rec.setFail(nil)
			if _, err := db.Pool.Exec(ctx, `
WITH q AS (UPDATE "`+db.Schema+`".outbox_pending SET dead = false, blocked = false, next_attempt_at = NULL WHERE dead)
UPDATE "`+db.Schema+`".outbox_event SET dead_at = NULL, attempts = 0, next_attempt_at = NULL WHERE dead_at IS NOT NULL`); err != nil {
				t.Fatal(err)
			}
			eventually(t, 20*time.Second, "requeued poison and the event behind it published", func() bool {
				got := rec.ids()
				return got[poison[0]] == 1 && got[behind[0]] == 1
			})
			var order []string
			for _, m := range rec.snapshot() {
				if m.UUID == poison[0] || m.UUID == behind[0] {
					order = append(order, m.UUID)
				}
			}
			if order[0] != poison[0] {
				t.Fatal("event behind the dead letter overtook it")
			}
		})
	}
}

func TestRelaySkipDeadLetteredKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	poison, _ := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "bad", Payload: []byte(`{}`)})
	rec := &recorder{batchErrors: true}
	rec.setFail(func(m *message.Message) error {
		if m.UUID == poison[0] {
			return core.Permanent(errors.New("rejected"))
		}
		return nil
	})
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, MaxAttempts: 1, SkipDeadLetteredKeys: true, PollInterval: 10 * time.Millisecond})
	eventually(t, 10*time.Second, "poison dead", func() bool { return countRows(t, db, "outbox_pending", "dead") == 1 })
	behind, _ := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "bad", Payload: []byte(`{}`)})
	eventually(t, 10*time.Second, "event behind a dead letter flows", func() bool { return rec.ids()[behind[0]] == 1 })
}

// While every publish fails with a temporary error (the broker is down), no
// attempts are counted and nothing is dead-lettered; all of it goes out
// after the outage.
func TestRelayOutageCountsNoAttempts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	rec := &recorder{}
	down := errors.New("broker unavailable")
	rec.setFail(func(*message.Message) error { return down })
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, MaxAttempts: 2, OutageBackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	ids := writeN(t, w, "t", 200, 7)
	eventually(t, 10*time.Second, "several failed tries", func() bool { return rec.calls.Load() > 5 })
	if n := countRows(t, db, "outbox_event", "attempts > 0 OR dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events charged an attempt during an outage", n)
	}
	rec.setFail(nil)
	eventually(t, 20*time.Second, "backlog drained after outage", func() bool { return len(rec.ids()) == len(ids) })
}

// testLogger sends Watermill logs to the test log when RELAY_LOG is set.
func testLogger(t *testing.T) watermill.LoggerAdapter {
	if os.Getenv("RELAY_LOG") == "" {
		return watermill.NopLogger{}
	}
	return watermill.NewStdLoggerWithOut(testWriter{t}, true, false)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// An idle relay woken by a hint looks at every lane, not only the window
// of lanes its next batch would take: an event in any lane goes out at
// once, not after polls walk the window round to it.
func TestRelayWakeUpCoversEveryLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	rec := &recorder{}
	// Polls are too rare to matter: only wake-ups can publish in time.
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, Workers: 1, LanesPerBatch: 8, PollInterval: time.Minute})
	lanes := map[int16]bool{}
	for i := 0; len(lanes) < 16; i++ {
		key := fmt.Sprintf("customer-%d", i)
		if lanes[outbox.Lane(key)] {
			continue
		}
		lanes[outbox.Lane(key)] = true
		time.Sleep(5 * time.Millisecond) // the write carries a hint
		ids, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: key, Payload: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Second, "event in lane "+fmt.Sprint(outbox.Lane(key))+" published", func() bool { return rec.ids()[ids[0]] == 1 })
	}
}

// A batch that interleaves topics goes out in one Publish call per topic,
// each in write order.
func TestRelayGroupsInterleavedTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	var events []outbox.Event
	for i := range 600 {
		events = append(events, outbox.Event{Topic: []string{"orders", "invoices", "audit"}[i%3], PartitionKey: fmt.Sprint("k", i%7),
			Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
	}
	if _, err := w.Write(ctx, events...); err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, Workers: 1, LanesPerBatch: outbox.Lanes, BatchSize: 1000})
	eventually(t, 10*time.Second, "600 events published", func() bool { return len(rec.ids()) == 600 })
	if calls := rec.calls.Load(); calls != 3 {
		t.Fatalf("%d Publish calls for one batch over 3 topics, want 3", calls)
	}
	last := map[string]int{}
	for _, m := range rec.snapshot() {
		var body struct{ Seq int }
		if err := json.Unmarshal(m.Payload, &body); err != nil {
			t.Fatal(err)
		}
		k := m.Metadata.Get("topic") + "/" + m.Metadata.Get(core.MetadataPartitionKey)
		if prev, ok := last[k]; ok && body.Seq <= prev {
			t.Fatalf("%s: seq %d after %d", k, body.Seq, prev)
		}
		last[k] = body.Seq
	}
}
