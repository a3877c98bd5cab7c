package outbox_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// The outage scenario the Redis Streams and NATS JetStream tests share.

// deliveries records what a consumer saw, in the order it saw it.
type deliveries struct {
	mu   sync.Mutex
	list []received
	seen map[string]int
}

func newDeliveries() *deliveries { return &deliveries{seen: map[string]int{}} }

func (d *deliveries) add(m *message.Message) {
	var body struct{ Seq int }
	_ = json.Unmarshal(m.Payload, &body)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.list = append(d.list, received{id: m.UUID, key: m.Metadata.Get(core.MetadataPartitionKey), seq: body.Seq})
	d.seen[m.UUID]++
}

// record subscribes to topic with sub and records what arrives,
// acknowledging each message, until the test ends.
func record(t *testing.T, sub message.Subscriber, topic string) *deliveries {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	d := newDeliveries()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			d.add(m)
			m.Ack()
		}
	}()
	// Registered after the subscriber's own cleanup, so it runs first: the
	// subscription ends, then the subscriber closes.
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return d
}

func (d *deliveries) unique() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}

// check fails the test unless every id arrived and, ignoring redeliveries,
// every key's events arrived in increasing seq (commit) order. It returns
// the number of duplicate deliveries.
func (d *deliveries) check(t *testing.T, ids []string) (duplicates int) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range ids {
		if d.seen[id] == 0 {
			t.Fatalf("event %s lost (%d of %d arrived)", id, len(d.seen), len(ids))
		}
	}
	last := map[string]int{}
	first := map[string]bool{}
	for _, m := range d.list {
		if first[m.id] {
			duplicates++
			continue
		}
		first[m.id] = true
		if prev, ok := last[m.key]; ok && m.seq <= prev {
			t.Fatalf("key %s: seq %d arrived after seq %d", m.key, m.seq, prev)
		}
		last[m.key] = m.seq
	}
	return duplicates
}

// drainThroughOutage writes a backlog of 5,000 events over 50 keys, drains
// it through a relay into pub, and kills the server (SIGKILL) mid-drain;
// 500 more events are written while it is down; three seconds later it
// starts again on the same port and data directory. It returns once the
// outbox is empty, with the ids of every event written, having checked
// that the relay dead-lettered nothing.
func drainThroughOutage(t *testing.T, db *pgtest.DB, srv *streamtest.Server, topic string, pub message.Publisher) []string {
	t.Helper()
	w := newWriter(t, db)
	ids := writeN(t, w, topic, 5_000, 50)
	startRelay(t, db, outbox.RelayConfig{Publisher: pub, BatchSize: 100, OutageBackoffMax: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond, Logger: testLogger(t)})
	eventually(t, 30*time.Second, "the drain under way", func() bool {
		return countRows(t, db, "outbox_event", "published_at IS NOT NULL") >= 500
	})
	srv.Kill()
	pending := countRows(t, db, "outbox_pending", "")
	if pending == 0 {
		t.Fatal("the backlog drained before the server was killed: the outage hit an idle relay")
	}
	ids = append(ids, writeSeqs(t, w, topic, 5_000, 500, 50)...)
	time.Sleep(3 * time.Second) // the outage itself, not a wait for something
	srv.Restart()
	restarted := time.Now()
	eventually(t, 2*time.Minute, "backlog drained after the restart", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	t.Logf("killed with %d of 5000 events pending; drained %v after the restart", pending, time.Since(restarted).Round(time.Millisecond))
	if n := countRows(t, db, "outbox_event", "dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events dead-lettered for the outage", n)
	}
	if n := countRows(t, db, "outbox_event", "attempts > 0"); n != 0 {
		t.Logf("%d events were charged an attempt during the outage (none dead)", n)
	}
	return ids
}
