package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

func newKafkaPublisher(t *testing.T, brokers []string) *kafka.Publisher {
	t.Helper()
	return newKafkaPublisherB(t, brokers)
}

func newKafkaPublisherB(t testing.TB, brokers []string) *kafka.Publisher {
	t.Helper()
	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// kafkaBundle is what every relay-through-Kafka test starts from: the
// brokers, an isolated schema, a Writer on it and a topic of its own.
type kafkaBundle struct {
	brokers []string
	db      *pgtest.DB
	w       *outbox.Writer
	topic   string
}

// kafkaSetup gives the test kafkatest's brokers and a schema from pgtest.New.
func kafkaSetup(t testing.TB) *kafkaBundle {
	t.Helper()
	return kafkaSetupWith(t, kafkatest.Brokers(t), pgtest.Options{})
}

// kafkaSetupWith is kafkaSetup on the given brokers, with pgtest options.
func kafkaSetupWith(t testing.TB, brokers []string, opts pgtest.Options) *kafkaBundle {
	t.Helper()
	db := pgtest.NewWith(t, opts)
	t.Cleanup(func() {
		if t.Failed() {
			logOutboxState(t, db)
		}
	})
	return &kafkaBundle{brokers: brokers, db: db, w: newWriter(t, db), topic: kafkatest.Topic()}
}

// logOutboxState logs, for a test that failed, where its outbox's events
// stand (published, dead, waiting; attempts; last errors), so a failure on a
// loaded machine says more than which wait timed out. It runs before the
// schema is dropped: Cleanup calls run last registered, first.
func logOutboxState(t testing.TB, db *pgtest.DB) {
	rows, err := db.Pool.Query(context.Background(), `SELECT
		CASE WHEN published_at IS NOT NULL THEN 'published' WHEN dead_at IS NOT NULL THEN 'dead' ELSE 'waiting' END,
		attempts, coalesce(left(last_error, 300), ''), count(*)
		FROM "`+db.Schema+`".outbox_event GROUP BY 1, 2, 3 ORDER BY 1, 2`)
	if err != nil {
		t.Logf("outbox state not read: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var state, lastErr string
		var attempts, n int
		if err := rows.Scan(&state, &attempts, &lastErr, &n); err != nil {
			t.Logf("outbox state not read: %v", err)
			return
		}
		t.Logf("outbox state: %d %s, %d attempts, last error %q", n, state, attempts, lastErr)
	}
}

// newAdmin returns an Admin on the bundle's schema.
func (b *kafkaBundle) newAdmin(t *testing.T) *outbox.Admin {
	t.Helper()
	admin, err := outbox.NewAdmin(b.db.Pool, outbox.AdminConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return admin
}

// received is one message as a separate consumer group saw it.
type received struct {
	id, key string
	seq     int
}

// consumer reads a topic with a fresh watermill-kafka consumer group and
// keeps what arrives, in arrival order.
type consumer struct {
	mu   sync.Mutex
	msgs []received
	seen map[string]int
}

func consume(t *testing.T, brokers []string, topic string) *consumer {
	t.Helper()
	sub := kafkatest.NewSubscriber(t, brokers)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	c := &consumer{seen: map[string]int{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			var body struct{ Seq int }
			_ = json.Unmarshal(m.Payload, &body)
			key, _ := wkafka.MessageKeyFromCtx(m.Context())
			c.mu.Lock()
			c.msgs = append(c.msgs, received{id: m.UUID, key: string(key), seq: body.Seq})
			c.seen[m.UUID]++
			c.mu.Unlock()
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
		<-done
	})
	return c
}

func (c *consumer) unique() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *consumer) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id]
}

// checkKeyOrder fails the test unless, ignoring redeliveries, every key's
// messages arrived in increasing seq order.
func (c *consumer) checkKeyOrder(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	last := map[string]int{}
	first := map[string]bool{}
	for _, m := range c.msgs {
		if first[m.id] {
			continue // a duplicate of something already seen
		}
		first[m.id] = true
		if prev, ok := last[m.key]; ok && m.seq <= prev {
			t.Fatalf("key %s: seq %d arrived after seq %d", m.key, m.seq, prev)
		}
		last[m.key] = m.seq
	}
}

// Four relays over 50,000 events on 1,000 keys, written while the relays
// run: every event arrives, each key's events in commit order, as a
// separate consumer group sees them.
func TestFourRelaysKeepPerKeyOrder(t *testing.T) {
	t.Parallel()
	const events, keys, writers = 50_000, 1_000, 8
	bundle := kafkaSetupWith(t, kafkatest.Brokers(t), pgtest.Options{MaxConns: 16})
	for i := 0; i < 4; i++ {
		// Each relay has its own pool and producer, as separate processes would.
		pool := pgtest.Pool(t, 4)
		cfg := outbox.RelayConfig{Schema: bundle.db.Schema, Publisher: newKafkaPublisher(t, bundle.brokers), BatchSize: 500, LanesPerBatch: outbox.Lanes / 4}
		r, err := outbox.NewRelay(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx) }() //nolint:errcheck
		t.Cleanup(func() { cancel(); <-done })
	}
	c := consume(t, bundle.brokers, bundle.topic)

	// Each writer owns keys k ≡ w (mod writers) and writes their events in
	// seq order, a few per transaction, so commit order per key is seq order.
	var wg sync.WaitGroup
	var failed atomic.Value
	for wr := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			var batch []outbox.Event
			for seq := wr; seq < events; seq += writers {
				batch = append(batch, outbox.Event{Topic: bundle.topic, PartitionKey: fmt.Sprintf("key-%d", seq%keys), Payload: fmt.Appendf(nil, `{"seq":%d}`, seq)})
				if len(batch) == 25 || seq+writers >= events {
					if _, err := bundle.w.Write(ctx, batch...); err != nil {
						failed.Store(err)
						return
					}
					batch = batch[:0]
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "all 50,000 events consumed", func() bool { return c.unique() == events })
	c.checkKeyOrder(t)
	// Nothing crashed, so nothing may be published twice: two relays never
	// hold a key's events at once.
	c.mu.Lock()
	dups := len(c.msgs) - len(c.seen)
	c.mu.Unlock()
	if dups != 0 {
		t.Fatalf("%d duplicates without any crash", dups)
	}
	// Marks commit just after the broker acknowledges.
	eventually(t, 30*time.Second, "pending set empty", func() bool { return countRows(t, bundle.db, "outbox_pending", "") == 0 })
}

// A relay that dies after the broker acknowledged a batch but before its
// mark committed publishes the batch again: a duplicate, never a loss.
func TestCrashBetweenProduceAndMarkDuplicatesNeverLoses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	ids := writeN(t, bundle.w, bundle.topic, 300, 10)

	// The relay's pool is told apart by application_name, so the crash can
	// kill exactly its connections.
	app := pgtest.RandomName("relay")
	// Set through pgx's config: DATABASE_URL may have no query string, or
	// be in keyword/value form.
	pcfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pcfg.MaxConns = 4
	relayPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	var crashed atomic.Bool
	crashing := &afterPublish{Publisher: newKafkaPublisher(t, bundle.brokers), after: func() {
		if crashed.CompareAndSwap(false, true) {
			// The batch is in Kafka; its transaction dies before the mark.
			if _, err := bundle.db.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
				t.Error(err)
			}
		}
	}}
	r, err := outbox.NewRelay(relayPool, outbox.RelayConfig{Schema: bundle.db.Schema, Publisher: crashing, BatchSize: 100, OutageBackoffMax: 50 * time.Millisecond, PollOnly: true, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }() //nolint:errcheck
	t.Cleanup(func() { cancel(); <-done })

	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, time.Minute, "every event consumed", func() bool { return c.unique() == len(ids) })
	eventually(t, 30*time.Second, "every event marked published", func() bool {
		return countRows(t, bundle.db, "outbox_event", "published_at IS NOT NULL") == len(ids)
	})
	if !crashed.Load() {
		t.Fatal("the crash never happened")
	}
	dups := 0
	for _, id := range ids {
		if c.count(id) > 1 {
			dups++
		}
	}
	if dups == 0 {
		t.Fatal("no duplicates: the crash did not land between produce and mark")
	}
	c.checkKeyOrder(t)
	t.Logf("%d of %d events delivered twice after the crash", dups, len(ids))
}

type afterPublish struct {
	message.Publisher
	after func()
}

func (p *afterPublish) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	if err == nil {
		p.after()
	}
	return err
}

// The broker stopped for several seconds while the relay drains a
// backlog: the rest of the backlog and what is written meanwhile wait, no
// attempt is charged, and after it returns everything arrives, in order per
// key.
func TestBrokerOutageMidRun(t *testing.T) {
	t.Parallel()
	broker, restart := kafkatest.Restartable(t)
	bundle := kafkaSetupWith(t, broker.Addrs(), pgtest.Options{})
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: bundle.brokers, ClientOptions: []kgo.Opt{
		kgo.DialTimeout(time.Second), kgo.RecordDeliveryTimeout(time.Second),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	first := writeN(t, bundle.w, bundle.topic, 20_000, 200)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: pub, OutageBackoffMax: 200 * time.Millisecond, BatchSize: 200, Logger: testLogger(t)})

	eventually(t, 30*time.Second, "the drain under way", func() bool {
		return countRows(t, bundle.db, "outbox_event", "published_at IS NOT NULL") > 0
	})
	broker.Close()
	if n := countRows(t, bundle.db, "outbox_pending", ""); n == 0 {
		t.Fatal("the backlog drained before the broker stopped: the outage hit an idle relay")
	}
	second := writeSeqs(t, bundle.w, bundle.topic, 20_000, 1000, 200)
	// Several seconds down: nothing can be published, nothing is charged.
	time.Sleep(3 * time.Second)
	if n := countRows(t, bundle.db, "outbox_event", "attempts > 0"); n != 0 {
		t.Fatalf("%d events charged attempts during the outage", n)
	}
	restart()
	restarted := time.Now()
	eventually(t, time.Minute, "backlog drained after the outage", func() bool { return countRows(t, bundle.db, "outbox_pending", "") == 0 })
	t.Logf("backlog drained %v after the broker came back", time.Since(restarted).Round(time.Millisecond))
	c := consume(t, bundle.brokers, bundle.topic)
	all := append(first, second...)
	eventually(t, time.Minute, "all events consumed", func() bool { return c.unique() == len(all) })
	for _, id := range all {
		if c.count(id) == 0 {
			t.Fatalf("event %s lost", id)
		}
	}
	c.checkKeyOrder(t)
	if n := countRows(t, bundle.db, "outbox_event", "attempts > 0"); n != 0 {
		t.Fatalf("%d events charged attempts for the outage", n)
	}
}

// writeSeqs writes n events numbered from, as writeN numbers from 0: event
// i has key key-(i mod keys) and seq i.
func writeSeqs(t *testing.T, w *outbox.Writer, topic string, from, n, keys int) []string {
	t.Helper()
	events := make([]outbox.Event, 0, n)
	for i := from; i < from+n; i++ {
		events = append(events, outbox.Event{Topic: topic, PartitionKey: fmt.Sprintf("key-%d", i%keys), Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
	}
	ids, err := w.Write(context.Background(), events...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// The scenario: a relay with the default RelayConfig and
// kafka.NewPublisher drains a backlog over 500 keys while the broker is
// stopped and restarted on the same port and data directory again and
// again. Every key's events arrive in order (a separate consumer group
// reads the topic), none is lost, none is charged an attempt.
func TestBrokerRestartsWhileDrainingKeepKeyOrder(t *testing.T) {
	t.Parallel()
	broker, restart := kafkatest.Restartable(t)
	bundle := kafkaSetupWith(t, broker.Addrs(), pgtest.Options{})
	ids := writeN(t, bundle.w, bundle.topic, 30_000, 500)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), Logger: testLogger(t)})

	restarts := 0
	for pending := countRows(t, bundle.db, "outbox_pending", ""); pending > 0 && restarts < 12; pending = countRows(t, bundle.db, "outbox_pending", "") {
		// Let the relay publish for a moment, then pull the broker away
		// mid-batch, for a moment.
		time.Sleep(time.Duration(100+restarts*37%200) * time.Millisecond)
		broker.Close()
		time.Sleep(time.Duration(200+restarts*71%600) * time.Millisecond)
		broker = restart()
		restarts++
		t.Logf("restart %d with %d events pending", restarts, pending)
	}
	if restarts < 3 {
		t.Fatalf("the backlog drained after %d restarts; the test needs the broker to go away mid-drain", restarts)
	}
	eventually(t, 2*time.Minute, "backlog drained", func() bool { return countRows(t, bundle.db, "outbox_pending", "") == 0 })
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, 2*time.Minute, "all events consumed", func() bool { return c.unique() == len(ids) })
	c.checkKeyOrder(t)
	if n := countRows(t, bundle.db, "outbox_event", "attempts > 0 OR dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events charged attempts or dead-lettered for broker restarts", n)
	}
	c.mu.Lock()
	t.Logf("%d restarts; %d records for %d events", restarts, len(c.msgs), len(ids))
	c.mu.Unlock()
}

// A message the broker side rejects for good is dead-lettered with its
// reason at once (one attempt, not MaxAttempts), while everything else
// keeps flowing.
func TestPoisonMessageDeadLetteredOthersFlow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	huge := `{"blob":"` + strings.Repeat("x", 2<<20) + `"}` // over the producer's 1 MB limit
	poison, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "poison", Payload: []byte(huge)})
	if err != nil {
		t.Fatal(err)
	}
	ids := writeN(t, bundle.w, bundle.topic, 500, 10)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, time.Minute, "other events consumed", func() bool { return c.unique() == len(ids) })
	eventually(t, 30*time.Second, "poison dead-lettered", func() bool {
		return countRows(t, bundle.db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1") == 1
	})
	var reason string
	if err := bundle.db.Pool.QueryRow(ctx, `SELECT last_error FROM "`+bundle.db.Schema+`".outbox_event WHERE event_id = $1`, poison[0]).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.ToLower(reason), "too large") {
		t.Fatalf("dead letter reason %q does not say why", reason)
	}
	if c.count(poison[0]) != 0 {
		t.Fatal("poison message reached the broker")
	}
}

// An event larger than its topic's max.message.bytes (set on the topic,
// under the producer's own limit) is refused before sending and
// dead-lettered at once, with the topic's limit in its reason; the later
// events of its key wait behind it, unpublished, while every other key's
// events flow.
func TestRecordOverTopicLimitDeadLetteredHoldsItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	kafkatest.CreateTopic(t, bundle.brokers, bundle.topic, -1, map[string]string{"max.message.bytes": "100000"})
	big := fmt.Appendf(nil, `{"seq":0,"blob":%q}`, strings.Repeat("x", 150_000))
	over, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "k", Payload: big})
	if err != nil {
		t.Fatal(err)
	}
	var behind []string
	for i := 1; i <= 3; i++ {
		id, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "k", Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
		if err != nil {
			t.Fatal(err)
		}
		behind = append(behind, id...)
	}
	others := writeN(t, bundle.w, bundle.topic, 300, 10)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	checkHeldBehindDeadLetter(t, bundle, c, over, behind, others, 0)
}

// The same when the topic's limit is lowered while the relay runs: the
// publisher learnt the old one, so the record is sent, and the broker
// refuses its batch, which holds the events behind it and other keys'
// (one transaction, one claim). The events behind it must stay held, not
// be sent again with the other keys' and stored ahead of it. (The first
// test takes this path too when the publisher cannot read the new topic's
// limit at once, as happened on the cluster.)
func TestRecordOverLoweredTopicLimitDeadLetteredHoldsItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	kafkatest.CreateTopic(t, bundle.brokers, bundle.topic, -1, nil)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), MaxAttempts: 3, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	warm, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "warm", Payload: []byte(`{"seq":0}`)})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the first event consumed", func() bool { return c.count(warm[0]) == 1 })
	kafkatest.SetTopicConfig(t, bundle.brokers, bundle.topic, "max.message.bytes", "100000")
	// Every broker reports the new limit before its log applies it: probe
	// until the leader refuses a record over it. A probe it still takes is
	// one more record on the topic (no event id), counted below.
	probes := probeUntilRefused(t, bundle.brokers, bundle.topic, 150_000)
	if probes > 0 {
		t.Logf("the topic took %d probes over its new limit before refusing one", probes)
	}

	events := []outbox.Event{{Topic: bundle.topic, PartitionKey: "k", Payload: fmt.Appendf(nil, `{"seq":0,"blob":%q}`, strings.Repeat("x", 150_000))}}
	for i := 1; i <= 3; i++ {
		events = append(events, outbox.Event{Topic: bundle.topic, PartitionKey: "k", Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
	}
	for i := range 300 {
		events = append(events, outbox.Event{Topic: bundle.topic, PartitionKey: fmt.Sprintf("key-%d", i%10), Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
	}
	ids, err := bundle.w.Write(ctx, events...)
	if err != nil {
		t.Fatal(err)
	}
	checkHeldBehindDeadLetter(t, bundle, c, ids[:1], ids[1:4], append(warm, ids[4:]...), probes)
}

// probeUntilRefused produces records of size bytes to topic until the
// broker refuses one as too large, and returns how many it took before.
func probeUntilRefused(t *testing.T, brokers []string, topic string, size int) int64 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ProducerBatchMaxBytes(int32(2*size)), kgo.RecordRetries(1),
		kgo.ProducerBatchCompression(kgo.NoCompression())) // the size the broker checks is the stored one
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var taken int64
	for deadline := time.Now().Add(time.Minute); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("probe"), Value: make([]byte, size)}).FirstErr()
		cancel()
		if errors.Is(err, kerr.MessageTooLarge) {
			return taken
		}
		if err == nil {
			taken++
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s still takes records of %d bytes (%d taken; last error %v)", topic, size, taken, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkHeldBehindDeadLetter waits for the others consumed and for over
// dead-lettered for the topic's limit, then checks that the events behind
// it are held, unpublished, and that nothing of its key reached the topic.
func checkHeldBehindDeadLetter(t *testing.T, bundle *kafkaBundle, c *consumer, over, behind, others []string, probes int64) {
	t.Helper()
	ctx := context.Background()
	extra := 0 // probes have no event id: one more distinct id, ""
	if probes > 0 {
		extra = 1
	}
	eventually(t, time.Minute, "other keys' events consumed", func() bool { return c.unique() >= len(others)+extra })
	eventually(t, 30*time.Second, "the record over the limit dead-lettered", func() bool {
		return countRows(t, bundle.db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1") == 1
	})
	var reason string
	if err := bundle.db.Pool.QueryRow(ctx, `SELECT last_error FROM "`+bundle.db.Schema+`".outbox_event WHERE event_id = $1 AND dead_at IS NOT NULL`, over[0]).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "100000") {
		t.Fatalf("dead letter reason %q does not name the topic's limit", reason)
	}
	// The events behind it were claimed with the later ones (they precede
	// every other key's events) and are still held.
	if n := countRows(t, bundle.db, "outbox_event", "published_at IS NULL AND dead_at IS NULL"); n != len(behind) {
		t.Fatalf("%d events unpublished and not dead, want the %d behind the dead letter", n, len(behind))
	}
	if n := kafkatest.RecordCount(t, bundle.brokers, bundle.topic); n != int64(len(others))+probes {
		t.Fatalf("topic holds %d records, want the %d of other keys and %d probes", n, len(others), probes)
	}
	for _, id := range append(over, behind...) {
		if c.count(id) != 0 {
			t.Fatalf("event %s of the held key reached the topic", id)
		}
	}
	for _, id := range others {
		if c.count(id) == 0 {
			t.Fatalf("event %s of another key was not consumed", id)
		}
	}
	c.checkKeyOrder(t)
}

// A dead letter holds the later events of its key; once the cause is fixed
// (here: the producer's size limit is raised) and an operator requeues it,
// it is published, then the events behind it, in order.
func TestRequeuedDeadLetterIsPublishedThroughKafka(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	admin := bundle.newAdmin(t)
	big := fmt.Appendf(nil, `{"seq":0,"blob":%q}`, strings.Repeat("x", 20_000))
	first, _ := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "k", Payload: big})
	behind, _ := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "k", Payload: []byte(`{"seq":1}`)})
	others := writeN(t, bundle.w, bundle.topic, 100, 5)

	strict, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: bundle.brokers, MaxMessageBytes: 10_000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { strict.Close() })
	stop := startRelay(t, bundle.db, outbox.RelayConfig{Publisher: strict, MaxAttempts: 2, RetryMin: time.Millisecond, RetryMax: time.Millisecond, PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, time.Minute, "others consumed", func() bool { return c.unique() == len(others) })
	eventually(t, 30*time.Second, "dead letter listed", func() bool {
		dl, err := admin.List(ctx, core.ListParams{})
		return err == nil && len(dl) == 1 && dl[0].EventID == first[0] && strings.Contains(dl[0].LastError, "too large")
	})
	if c.count(first[0]) != 0 || c.count(behind[0]) != 0 {
		t.Fatal("the dead letter or the event behind it reached Kafka")
	}
	stop()

	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), PollInterval: 10 * time.Millisecond})
	if n, err := admin.Requeue(ctx, opsActor, first[0]); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	eventually(t, 30*time.Second, "requeued event and the one behind it consumed", func() bool {
		return c.count(first[0]) == 1 && c.count(behind[0]) == 1
	})
	c.checkKeyOrder(t)
}

// Replay publishes a selection again with the original event
// ids, so idempotent consumers can skip what they applied.
func TestReplayRepublishesWithSameEventIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bundle := kafkaSetup(t)
	admin := bundle.newAdmin(t)
	var replayed, kept []string
	for i := range 40 {
		agg := "order-1"
		if i%2 == 1 {
			agg = "order-2"
		}
		ids, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: agg, AggregateType: "Order", AggregateID: agg, Payload: fmt.Appendf(nil, `{"seq":%d}`, i)})
		if err != nil {
			t.Fatal(err)
		}
		if agg == "order-1" {
			replayed = append(replayed, ids[0])
		} else {
			kept = append(kept, ids[0])
		}
	}
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: newKafkaPublisher(t, bundle.brokers), PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, 30*time.Second, "first delivery", func() bool { return c.unique() == 40 })
	// The consumer can see a batch before the relay's mark commits; an event
	// still pending is not queued again, so wait for the marks.
	eventually(t, 30*time.Second, "first delivery marked published", func() bool {
		return countRows(t, bundle.db, "outbox_pending", "") == 0
	})
	n, err := admin.Replay(ctx, outbox.ReplayFilter{AggregateType: "Order", AggregateID: "order-1"}, opsActor)
	if err != nil || n != int64(len(replayed)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(replayed))
	}
	eventually(t, 30*time.Second, "replayed events delivered again", func() bool {
		for _, id := range replayed {
			if c.count(id) != 2 {
				return false
			}
		}
		return true
	})
	for _, id := range kept {
		if c.count(id) != 1 {
			t.Fatalf("event %s outside the replay filter delivered %d times", id, c.count(id))
		}
	}
}

// A broker restarted without its data (an embedded broker without a data
// directory) comes back with no topics; recreated on first use, a topic has
// a new id, and a producer that still holds the old one is answered
// UNKNOWN_TOPIC_ID. The relay keeps going by itself: what is written after
// the restart arrives, none of it lost, none of it dead-lettered.
func TestBrokerRestartedWithoutDataRelayKeepsPublishing(t *testing.T) {
	t.Parallel()
	broker := kafkatest.Embedded(t, devkafka.Config{})
	port := broker.Port()
	bundle := kafkaSetupWith(t, broker.Addrs(), pgtest.Options{})
	pub := newKafkaPublisher(t, bundle.brokers)
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: pub, OutageBackoffMax: 200 * time.Millisecond, Logger: testLogger(t)})
	writeN(t, bundle.w, bundle.topic, 200, 20)
	eventually(t, time.Minute, "first events published", func() bool { return countRows(t, bundle.db, "outbox_pending", "") == 0 })

	broker.Close()
	kafkatest.Embedded(t, devkafka.Config{Port: port}) // empty: the topic is gone
	after := writeSeqs(t, bundle.w, bundle.topic, 200, 300, 20)
	eventually(t, time.Minute, "events written after the restart published", func() bool {
		return countRows(t, bundle.db, "outbox_pending", "") == 0
	})
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, time.Minute, "events written after the restart consumed", func() bool { return c.unique() >= len(after) })
	for _, id := range after {
		if c.count(id) == 0 {
			t.Fatalf("event %s, written after the restart, lost", id)
		}
	}
	c.checkKeyOrder(t)
	if n := countRows(t, bundle.db, "outbox_event", "dead_at IS NOT NULL"); n != 0 {
		t.Fatalf("%d events dead-lettered for the restart", n)
	}
}
