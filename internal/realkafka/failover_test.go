package realkafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/internal/kafkacluster"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// bundle is what a failover test starts from: the cluster, an isolated
// schema with a Writer, and a topic of its own with 8 partitions,
// replication factor 3.
type bundle struct {
	c     *kafkacluster.Cluster
	db    *pgtest.DB
	w     *outbox.Writer
	topic string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	c := kafkacluster.Require(t)
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 16})
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{c: c, db: db, w: w, topic: kafkatest.Topic()}
	b.createTopic(t, 8)
	return b
}

// createTopic creates the bundle's topic with the cluster's default
// replication factor (3) and waits until every partition has a leader.
func (b *bundle) createTopic(t *testing.T, partitions int32) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.c.Brokers()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = b.topic, partitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30_000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].ErrorCode; code != 0 {
		t.Fatalf("create topic %s: error code %d", b.topic, code)
	}
	for {
		ps, err := b.c.Partitions(ctx, b.topic)
		led := 0
		for _, p := range ps {
			if p.Leader > 0 && len(p.ISR) == 3 {
				led++
			}
		}
		if err == nil && led == int(partitions) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("topic %s: %d of %d partitions led and fully in sync (%v)", b.topic, led, partitions, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// write commits n events numbered from seq over keys keys, 1,000 to a
// transaction, and returns their ids.
func (b *bundle) write(t *testing.T, from, n, keys int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for start := from; start < from+n; start += 1000 {
		events := make([]outbox.Event, 0, 1000)
		for i := start; i < min(from+n, start+1000); i++ {
			events = append(events, outbox.Event{
				Topic:        b.topic,
				PartitionKey: fmt.Sprintf("key-%d", i%keys),
				EventType:    "Counted",
				Payload:      fmt.Appendf(nil, `{"seq":%d}`, i),
			})
		}
		got, err := b.w.Write(context.Background(), events...)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, got...)
	}
	return ids
}

// startRelays starts n relays on the bundle's schema, each with its own
// kafka.Publisher on the cluster, stopped when the test ends.
func (b *bundle) startRelays(t *testing.T, n int) {
	t.Helper()
	for range n {
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.c.Brokers()}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := outbox.NewRelay(b.db.Pool, outbox.RelayConfig{Schema: b.db.Schema, Publisher: pub, Workers: 2, BatchSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Relay.Run: %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("Relay.Run did not return within a minute of cancel")
			}
			pub.Close()
		})
	}
}

func (b *bundle) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), fmt.Sprintf(query, `"`+b.db.Schema+`"`)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) published(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM %s.outbox_event WHERE published_at IS NOT NULL`)
}

func (b *bundle) pending(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM %s.outbox_pending`)
}

func (b *bundle) dead(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM %s.outbox_pending WHERE dead`)
}

// charged counts the events the relay charged an attempt (a failure that
// was neither an outage nor temporary).
func (b *bundle) charged(t *testing.T) int {
	return b.count(t, `SELECT count(*) FROM %s.outbox_event WHERE attempts > 0`)
}

// waitFor polls cond every 100 ms until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reader reads the topic from its start with a franz-go consumer of its own
// (no group), apart from the code under test, and keeps what arrives in
// arrival order.
type reader struct {
	mu   sync.Mutex
	recs []record
	seen map[string]int
}

type record struct {
	id, key string
	seq     int
}

func (b *bundle) read(t *testing.T) *reader {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(b.c.Brokers()...),
		kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		t.Fatal(err)
	}
	r := &reader{seen: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			fs.EachRecord(func(rec *kgo.Record) {
				var id string
				for _, h := range rec.Headers {
					if h.Key == "_watermill_message_uuid" {
						id = string(h.Value)
					}
				}
				var body struct{ Seq int }
				_ = json.Unmarshal(rec.Value, &body)
				r.mu.Lock()
				r.recs = append(r.recs, record{id: id, key: string(rec.Key), seq: body.Seq})
				r.seen[id]++
				r.mu.Unlock()
			})
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
	})
	return r
}

func (r *reader) unique() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// verdict is what the reader saw of the events written.
type verdict struct {
	events, lost, duplicates, orderViolations int
}

func (v verdict) String() string {
	return fmt.Sprintf("events=%d lost=%d duplicates=%d order_violations=%d", v.events, v.lost, v.duplicates, v.orderViolations)
}

// check counts, against the ids written, the events that never arrived,
// the copies beyond the first, and the keys whose events first arrived out
// of seq order; it fails the test on a loss or a reorder.
func (r *reader) check(t *testing.T, ids []string) verdict {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	v := verdict{events: len(ids)}
	for _, id := range ids {
		if r.seen[id] == 0 {
			v.lost++
		}
	}
	last := map[string]int{}
	first := map[string]bool{}
	for _, rec := range r.recs {
		if first[rec.id] {
			v.duplicates++
			continue
		}
		first[rec.id] = true
		if prev, ok := last[rec.key]; ok && rec.seq < prev {
			if v.orderViolations == 0 {
				t.Errorf("%s: seq %d arrived after seq %d", rec.key, rec.seq, prev)
			}
			v.orderViolations++
		}
		last[rec.key] = rec.seq
	}
	if v.lost > 0 {
		t.Errorf("%d of %d events never reached the topic", v.lost, len(ids))
	}
	if v.orderViolations > 0 {
		t.Errorf("%d events arrived out of order for their key", v.orderViolations)
	}
	return v
}

// A 50k-event backlog over 500 keys drains through two relays while the
// node leading most of the topic's partitions is SIGKILLed, and restarted
// 10 s later. Nothing is lost or reordered, the relays charge no attempt for
// the leader change, and the drain goes on while the node is down: the two
// others hold two in-sync replicas, as min.insync.replicas=2 asks.
func TestFailoverLeaderKilledMidDrain(t *testing.T) {
	b := setup(t)
	const events, keys = 50_000, 500
	ids := b.write(t, 0, events, keys)
	r := b.read(t)
	start := time.Now()
	b.startRelays(t, 2)

	waitFor(t, 2*time.Minute, "the drain to start", func() bool { return b.published(t) >= 2_000 })
	ctx := context.Background()
	node, led, err := b.c.MostLeader(ctx, b.topic)
	if err != nil {
		t.Fatal(err)
	}
	atKill := b.published(t)
	if err := b.c.Kill(node); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed node %d (leading %d of 8 partitions) with %d of %d events published", node, led, atKill, events)
	// The node stays down for 10 s: that is the scenario, not a wait for
	// something to happen.
	time.Sleep(10 * time.Second)
	whileDown := b.published(t) - atKill
	if err := b.c.Start(ctx, node); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 4*time.Minute, "the outbox to drain", func() bool { return b.pending(t) == 0 })
	drain := time.Since(start)
	waitFor(t, 2*time.Minute, "every event at the reader", func() bool { return r.unique() >= events })

	v := r.check(t, ids)
	if atKill >= events {
		t.Errorf("the drain finished before the kill (%d published): nothing was tested", atKill)
	}
	if whileDown == 0 {
		t.Errorf("nothing was published in the 10 s node %d was down", node)
	}
	if n := b.charged(t); n != 0 {
		t.Errorf("%d events were charged an attempt for a leader change", n)
	}
	if n := b.dead(t); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
	t.Logf("leader killed mid-drain: %v kills=1 published_while_down=%d drain=%v", v, whileDown, drain.Round(time.Millisecond))
}

// With two of the three nodes down no write can have two in-sync replicas:
// the relay waits. The outbox grows, nothing is dead-lettered or charged an
// attempt, the process's heap stays bounded, and once one node is back the
// backlog drains in order.
func TestFailoverTwoNodesDown(t *testing.T) {
	b := setup(t)
	const keys = 100
	r := b.read(t)
	b.startRelays(t, 1)
	ids := b.write(t, 0, 2_000, keys)
	waitFor(t, 2*time.Minute, "the first events to drain", func() bool { return b.pending(t) == 0 })

	down := []int{2, 3}
	for _, n := range down {
		if err := b.c.Kill(n); err != nil {
			t.Fatal(err)
		}
	}
	atKill := b.published(t)
	start := time.Now()
	// Writes go on while the cluster cannot take them: 10,000 events over
	// 20 s, sampling the heap as they go.
	var maxHeap uint64
	for i := range 20 {
		ids = append(ids, b.write(t, 2_000+i*500, 500, keys)...)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		maxHeap = max(maxHeap, ms.HeapInuse)
		time.Sleep(time.Second)
	}
	whileDown := b.published(t) - atKill
	pendingDown := b.pending(t)
	if whileDown != 0 {
		t.Errorf("%d events acknowledged with two of three nodes down: acks from all in-sync replicas with min.insync.replicas=2 should refuse them", whileDown)
	}
	if pendingDown < 9_000 {
		t.Errorf("only %d events pending with two nodes down: the outbox should hold the writes", pendingDown)
	}
	if n := b.dead(t); n != 0 {
		t.Errorf("%d events dead-lettered during the outage", n)
	}
	if maxHeap > 256<<20 {
		t.Errorf("heap in use reached %d MiB during the outage", maxHeap>>20)
	}
	if err := b.c.Start(context.Background(), down[0]); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitFor(t, 4*time.Minute, "the outbox to drain after one node came back", func() bool { return b.pending(t) == 0 })
	drain := time.Since(back)
	waitFor(t, 2*time.Minute, "every event at the reader", func() bool { return r.unique() >= len(ids) })
	v := r.check(t, ids)
	if n := b.dead(t); n != 0 {
		t.Errorf("%d events dead-lettered", n)
	}
	t.Logf("two nodes down for %v: %v published_while_down=%d pending_while_down=%d max_heap=%d MiB drain_after_one_back=%v charged=%d",
		back.Sub(start).Round(time.Second), v, whileDown, pendingDown, maxHeap>>20, drain.Round(time.Millisecond), b.charged(t))
}
