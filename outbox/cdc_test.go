package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// cdcBundle is a schema set up for change data capture: its publication
// and slot (dropped when the test ends: a slot left behind keeps WAL on the
// shared server for good), a CDC Writer and an Admin.
type cdcBundle struct {
	db    *pgtest.DB
	w     *outbox.Writer
	admin *outbox.Admin
	topic string
}

func cdcSetup(t testing.TB, db *pgtest.DB) *cdcBundle {
	t.Helper()
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateCDC(context.Background(), ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the relays stopped (cleanups run last in, first out); the
		// server may take a moment to release the slot of a stream just
		// ended.
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := admin.DropCDC(context.Background(), "")
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("drop CDC slot: %v", err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Cleanup(func() {
		// After the relays stopped, before the slot is dropped.
		if t.Failed() {
			logOutboxState(t, db)
			logSlots(t, db)
		}
	})
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, CDC: true})
	if err != nil {
		t.Fatal(err)
	}
	return &cdcBundle{db: db, w: w, admin: admin, topic: kafkatest.Topic()}
}

// startCDCRelay runs a CDC relay on pool until the test ends.
func startCDCRelay(t *testing.T, pool *pgxpool.Pool, cfg outbox.CDCRelayConfig) {
	t.Helper()
	r, err := outbox.NewCDCRelay(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCDCRelay(t, r)
}

// runCDCRelay runs r until the test ends.
func runCDCRelay(t *testing.T, r *outbox.CDCRelay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("CDC relay: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("CDC relay did not stop within 30s")
		}
	})
}

func published(t testing.TB, pool *pgxpool.Pool, schema string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".outbox_event WHERE published_at IS NOT NULL`).Scan(&n)
	if err != nil {
		return -1 // the server restarting
	}
	return n
}

// The CDC writer inserts the log row only; the CDC relay publishes every
// event, each key's in commit order, marks them published, and the slot's
// confirmed position moves past them.
func TestCDCRelayDelivers(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	b := cdcSetup(t, pgtest.New(t))
	ids := writeN(t, b.w, b.topic, 3000, 50)
	if n := countRows(t, b.db, "outbox_pending", ""); n != 0 {
		t.Fatalf("the CDC writer wrote %d pending rows", n)
	}
	reg := prometheus.NewPedanticRegistry()
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: newKafkaPublisher(t, brokers), Metrics: reg, Logger: testLogger(t)}})
	more := writeSeqs(t, b.w, b.topic, 3000, 500, 50) // while it runs
	c := consume(t, brokers, b.topic)
	all := append(ids, more...)
	eventually(t, time.Minute, "every event consumed", func() bool { return c.unique() == len(all) })
	c.checkKeyOrder(t)
	eventually(t, 30*time.Second, "every event marked published", func() bool { return published(t, b.db.Pool, b.db.Schema) == len(all) })
	eventually(t, 30*time.Second, "the slot active and its lag gauge reported", func() bool {
		return strings.Contains(gather(t, reg), "millrace_outbox_cdc_slot_active 1")
	})
	// Every event went out in a batch (at least once).
	if sizes := histogram(t, reg, "millrace_outbox_batch_size"); sizes.GetSampleSum() < float64(len(all)) || sizes.GetSampleCount() < 1 {
		t.Errorf("batch_size histogram: %v events in %d batches, want at least %d events", sizes.GetSampleSum(), sizes.GetSampleCount(), len(all))
	}
}

func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			v := 0.0
			switch {
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			case m.Counter != nil:
				v = m.Counter.GetValue()
			}
			fmt.Fprintf(&sb, "%s %g\n", mf.GetName(), v)
		}
	}
	return sb.String()
}

// Start-up refusals: a server without wal_level=logical, and a group
// whose slot was never created.
func TestCDCRelayRefusesToStart(t *testing.T) {
	t.Parallel()
	t.Run("no slot", func(t *testing.T) {
		t.Parallel()
		db := pgtest.New(t)
		r, err := outbox.NewCDCRelay(db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: db.Schema, Publisher: &recorder{}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := r.Run(ctx); !errors.Is(err, outbox.ErrNoSlot) {
			t.Fatalf("Run = %v, want ErrNoSlot", err)
		}
	})
	t.Run("wal_level replica", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.StartServer(t, nil, "wal_level=replica")
		db := srv.DB(t, 4)
		admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.CreateCDC(context.Background(), ""); !errors.Is(err, outbox.ErrWALLevel) {
			t.Fatalf("CreateCDC = %v, want ErrWALLevel", err)
		}
		r, err := outbox.NewCDCRelay(db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: db.Schema, Publisher: &recorder{}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = r.Run(ctx)
		if !errors.Is(err, outbox.ErrWALLevel) || !strings.Contains(err.Error(), "wal_level = replica") {
			t.Fatalf("Run = %v, want ErrWALLevel naming the server's wal_level", err)
		}
	})
}

// A permanent failure in CDC mode is a dead letter recorded in the table:
// listed by the Admin, later events of its key wait behind it (handed to
// the pending set), other keys flow; requeued, it and the events held
// behind it go out in order. Replay works as in polling mode.
func TestCDCDeadLetterHoldsItsKeyAndRequeues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := cdcSetup(t, pgtest.New(t))
	ids := writeN(t, b.w, b.topic, 200, 4) // key-0 .. key-3
	poison := ids[10]                      // key-2
	var healed atomic.Bool
	rec := &recorder{batchErrors: true, fail: func(m *message.Message) error {
		if m.UUID == poison && !healed.Load() {
			return core.Permanent(errors.New("poison"))
		}
		return nil
	}}
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: rec, PollInterval: 20 * time.Millisecond, Logger: testLogger(t)}})
	eventually(t, 30*time.Second, "the other keys published", func() bool { return len(rec.ids()) == 152 })
	// The publisher saw the batch before the relay's mark committed: wait
	// for the dead letter to be recorded too.
	var dead []outbox.DeadLetter
	eventually(t, 30*time.Second, "the dead letter recorded", func() bool {
		var err error
		dead, err = b.admin.List(ctx, core.ListParams{})
		if err != nil {
			t.Fatal(err)
		}
		return len(dead) > 0
	})
	if len(dead) != 1 || dead[0].EventID != poison || !strings.Contains(dead[0].LastError, "poison") {
		t.Fatalf("dead letters = %+v, want the poison event", dead)
	}
	// The stream may still be handing the key's last events to the pending
	// set when the other keys are out: wait for all 47, then check none of
	// them was published past the dead letter.
	eventually(t, 30*time.Second, "the key's 47 later events held behind the dead letter", func() bool {
		return countRows(t, b.db, "outbox_pending", "NOT dead") == 47
	})
	if n := len(rec.ids()); n != 152 {
		t.Fatalf("%d events published with the dead letter in place, want the other keys' 152", n)
	}
	healed.Store(true)
	if n, err := b.admin.Requeue(ctx, opsActor, poison); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	eventually(t, 30*time.Second, "the dead letter and its key published", func() bool { return len(rec.ids()) == 200 })
	var key2 []string
	for _, m := range rec.snapshot() {
		if m.Metadata.Get(core.MetadataPartitionKey) == "key-2" {
			key2 = append(key2, m.UUID)
		}
	}
	for i, id := range key2 {
		if id != ids[2+4*i] {
			t.Fatalf("key-2 out of order at %d: %s, want %s", i, id, ids[2+4*i])
		}
	}
	// Only events marked published are replayed: wait for the last marks.
	eventually(t, 30*time.Second, "every event marked published", func() bool { return published(t, b.db.Pool, b.db.Schema) == 200 })
	n, err := b.admin.Replay(ctx, outbox.ReplayFilter{PartitionKey: "key-1"}, opsActor)
	if err != nil || n != 50 {
		t.Fatalf("Replay = %d, %v; want 50", n, err)
	}
	eventually(t, 30*time.Second, "the replay published", func() bool { return len(rec.snapshot()) >= 250 })
}

// TestHelperCDCRelayChild is the helper process of
// TestCDCRelaySIGKILLedMidDrain: it runs a CDC relay and announces READY
// at a random point after a random number of batches the broker
// acknowledged, so the kill lands anywhere between the broker's ack, the
// mark and the slot's confirmation.
func TestHelperCDCRelayChild(t *testing.T) {
	schema := os.Getenv("CDC_CHILD_SCHEMA")
	if schema == "" {
		t.Skip("helper process for TestCDCRelaySIGKILLedMidDrain")
	}
	pool, err := pgtest.Connect(context.Background(), pgtest.URL(), 4)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: strings.Split(os.Getenv("CDC_CHILD_BROKERS"), ",")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Killed after 2 to 8 acknowledged batches, 0 to 5ms after the ack:
	// before its mark, during it, or after the slot's confirmation.
	k := rand.Int32N(7) + 2
	delay := time.Duration(rand.Int64N(int64(5 * time.Millisecond)))
	var n atomic.Int32
	var once sync.Once
	announce := func() { once.Do(childtest.Announce) }
	time.AfterFunc(3*time.Second, announce) // the backlog drained: die idle
	r, err := outbox.NewCDCRelay(pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{
		Schema: schema, BatchSize: 100, Logger: watermill.NopLogger{},
		Publisher: &afterPublish{Publisher: pub, after: func() {
			if n.Add(1) == k {
				time.AfterFunc(delay, announce)
			}
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Run(context.Background()) // until killed
}

// The CDC relay SIGKILLed 50 times mid-drain, each time in a fresh
// process: a separate consumer group sees every event, each key's in
// order; the crashes cost duplicates only.
func TestCDCRelaySIGKILLedMidDrain(t *testing.T) {
	t.Parallel()
	const kills = 50
	brokers := kafkatest.Brokers(t)
	b := cdcSetup(t, pgtest.New(t))
	// Half the backlog in transactions of 1,000 events (larger than a
	// batch), half in transactions of 25 (many in a batch).
	ids := writeN(t, b.w, b.topic, 15_000, 300)
	for from := 15_000; from < 30_000; from += 25 {
		ids = append(ids, writeSeqs(t, b.w, b.topic, from, 25, 300)...)
	}
	c := consume(t, brokers, b.topic)
	env := []string{"CDC_CHILD_SCHEMA=" + b.db.Schema, "CDC_CHILD_BROKERS=" + strings.Join(brokers, ",")}
	start := time.Now()
	var more []string
	for i := range kills {
		childtest.KillAtReady(t, "TestHelperCDCRelayChild", env, time.Minute)
		if i%10 == 0 { // and writes go on meanwhile
			more = append(more, writeSeqs(t, b.w, b.topic, 30_000+i*100, 100, 300)...)
		}
	}
	killed := time.Since(start)
	before := published(t, b.db.Pool, b.db.Schema)
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: newKafkaPublisher(t, brokers), Logger: testLogger(t)}})
	all := append(ids, more...)
	eventually(t, 2*time.Minute, "every event consumed", func() bool { return c.unique() == len(all) })
	drained := time.Since(start)
	lost := 0
	for _, id := range all {
		if c.count(id) == 0 {
			lost++
		}
	}
	c.checkKeyOrder(t)
	c.mu.Lock()
	dups := len(c.msgs) - len(c.seen)
	c.mu.Unlock()
	if lost != 0 {
		t.Fatalf("%d events lost", lost)
	}
	if before <= 0 {
		t.Fatal("the killed relays published nothing: the kills did not land mid-drain")
	}
	t.Logf("%d events, %d SIGKILLs in %v (%d marked published by the killed relays), 0 lost, 0 order violations, %d duplicates, all consumed after %v",
		len(all), kills, killed.Round(time.Millisecond), before, dups, drained.Round(time.Millisecond))
}

// PostgreSQL restarted mid-drain (a private server: restarting the shared
// one would disturb the other tests): the relay reconnects and streams
// again from the confirmed position; nothing is lost, order holds.
func TestCDCRelayPostgresRestartMidDrain(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	srv := pgtest.StartServer(t, nil, "wal_level=logical", "max_wal_senders=4", "max_replication_slots=4")
	b := cdcSetup(t, srv.DB(t, 8))
	ids := writeN(t, b.w, b.topic, 20_000, 200)
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: newKafkaPublisher(t, brokers), BatchSize: 200, OutageBackoffMax: 200 * time.Millisecond, Logger: testLogger(t)}})
	eventually(t, time.Minute, "the drain under way", func() bool { return published(t, b.db.Pool, b.db.Schema) > 0 })
	srv.Restart(t)
	if n := published(t, b.db.Pool, b.db.Schema); n >= len(ids) {
		t.Logf("warning: the backlog (%d) had drained when the server restarted", n)
	}
	var more []string
	eventually(t, 30*time.Second, "a write after the restart", func() bool {
		got, err := b.w.Write(context.Background(), outbox.Event{Topic: b.topic, PartitionKey: "key-0", Payload: []byte(`{"seq":1000000}`)})
		more = got
		return err == nil
	})
	c := consume(t, brokers, b.topic)
	all := append(ids, more...)
	eventually(t, 2*time.Minute, "every event consumed", func() bool { return c.unique() == len(all) })
	c.checkKeyOrder(t)
	eventually(t, 30*time.Second, "every event marked published", func() bool { return published(t, b.db.Pool, b.db.Schema) == len(all) })
}

// The broker stopped while the CDC relay drains: nothing is confirmed, the
// slot's lag grows with what is written meanwhile (the slot holds the WAL,
// the outbox grows), no attempt is charged; back, the backlog drains and
// the slot's position passes everything written.
func TestCDCBrokerOutageSlotLagGrowsThenDrains(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker, restart := kafkatest.Restartable(t)
	b := cdcSetup(t, pgtest.New(t))
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: broker.Addrs(), ClientOptions: []kgo.Opt{
		kgo.DialTimeout(time.Second), kgo.RecordDeliveryTimeout(time.Second),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	first := writeN(t, b.w, b.topic, 10_000, 100)
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{StatusInterval: 100 * time.Millisecond, RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: pub, BatchSize: 200, OutageBackoffMax: 200 * time.Millisecond, Logger: testLogger(t)}})
	eventually(t, 30*time.Second, "the drain under way", func() bool { return published(t, b.db.Pool, b.db.Schema) > 0 })
	broker.Close()
	stuck := func() (confirmed, current int64) {
		err := b.db.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn - '0/0'::pg_lsn, pg_current_wal_lsn() - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, outbox.DefaultSlot(b.db.Schema)).Scan(&confirmed, &current)
		if err != nil {
			t.Fatal(err)
		}
		return confirmed, current
	}
	// Let the relay's in-flight batch end (on a loaded machine its last
	// acknowledged events may be confirmed after the broker went): the
	// position stays where it is for a second.
	confirmed0, _ := stuck()
	for still, deadline := time.Now(), time.Now().Add(30*time.Second); time.Since(still) < time.Second; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slot's position kept moving for 30 s after the broker went")
		}
		if c, _ := stuck(); c != confirmed0 {
			confirmed0, still = c, time.Now()
		}
	}
	lag0, err := b.admin.SlotStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	second := writeSeqs(t, b.w, b.topic, 10_000, 2000, 100)
	_, afterWrites := stuck()
	time.Sleep(2 * time.Second) // down for a while: nothing may be confirmed
	confirmed1, _ := stuck()
	lag1, err := b.admin.SlotStats(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if confirmed1 != confirmed0 {
		t.Fatalf("the slot's position moved during the outage: %d -> %d", confirmed0, confirmed1)
	}
	if lag1.LagBytes <= lag0.LagBytes || lag1.LagBytes < afterWrites-confirmed0 {
		t.Fatalf("slot lag %d -> %d bytes during the outage, want growth to at least %d", lag0.LagBytes, lag1.LagBytes, afterWrites-confirmed0)
	}
	if n := countRows(t, b.db, "outbox_event", "attempts > 0"); n != 0 {
		t.Fatalf("%d events charged attempts during the outage", n)
	}
	broker = restart()
	back := time.Now()
	all := append(first, second...)
	eventually(t, time.Minute, "backlog marked published", func() bool { return published(t, b.db.Pool, b.db.Schema) == len(all) })
	eventually(t, 30*time.Second, "the slot's position past everything written", func() bool {
		c, _ := stuck()
		return c >= afterWrites
	})
	lag2, _ := b.admin.SlotStats(ctx, "")
	t.Logf("slot lag %d bytes before the writes, %d during the outage, %d drained %v after the broker came back", lag0.LagBytes, lag1.LagBytes, lag2.LagBytes, time.Since(back).Round(time.Millisecond))
	c := consume(t, broker.Addrs(), b.topic)
	eventually(t, time.Minute, "all events consumed", func() bool { return c.unique() == len(all) })
	c.checkKeyOrder(t)
}

// A slot invalidated because it kept more WAL than max_slot_wal_keep_size
// (a private server with 1 MB WAL segments and a 2 MB cap): it is
// reported (the slot gauges, the invalidations counter, an error log),
// replaced, and every event it held goes out from the log by state:
// nothing is lost, order holds, and the new slot streams what follows.
func TestCDCInvalidatedSlotRecoveredWithoutLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	srv := pgtest.StartServer(t, []string{"--wal-segsize=1"}, "wal_level=logical", "max_wal_senders=4", "max_replication_slots=4",
		"max_slot_wal_keep_size=2MB", "min_wal_size=2MB", "max_wal_size=4MB")
	b := cdcSetup(t, srv.DB(t, 8))
	reg := prometheus.NewPedanticRegistry()

	held := writeN(t, b.w, b.topic, 2000, 40) // no relay runs: the slot holds them
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE filler (pad text)`); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the slot invalidated", func() bool {
		if _, err := b.db.Pool.Exec(ctx, `INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000); CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		st, err := b.admin.SlotStats(ctx, "")
		return err == nil && st.WALStatus == "lost"
	})
	after := writeSeqs(t, b.w, b.topic, 2000, 500, 40) // written to the lost slot
	relay, err := outbox.NewCDCRelay(b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: newKafkaPublisher(t, brokers), Metrics: reg, PollInterval: 50 * time.Millisecond, Logger: testLogger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(gather(t, reg), "millrace_outbox_cdc_slot_invalidated 1") {
		t.Fatalf("the invalidated slot is not reported:\n%s", gather(t, reg))
	}
	runCDCRelay(t, relay)
	c := consume(t, brokers, b.topic)
	eventually(t, time.Minute, "the held events consumed", func() bool { return c.unique() == len(held)+len(after) })
	streamed := writeSeqs(t, b.w, b.topic, 2500, 500, 40) // the new slot streams these
	all := append(append(held, after...), streamed...)
	eventually(t, time.Minute, "every event consumed", func() bool { return c.unique() == len(all) })
	for _, id := range all {
		if c.count(id) == 0 {
			t.Fatalf("event %s lost", id)
		}
	}
	c.checkKeyOrder(t)
	text := gather(t, reg)
	if !strings.Contains(text, "millrace_outbox_cdc_slot_invalidations_total 1") || !strings.Contains(text, "millrace_outbox_cdc_slot_invalidated 0") {
		t.Fatalf("metrics after the recovery:\n%s", text)
	}
	st, err := b.admin.SlotStats(ctx, "")
	if err != nil || st.Name == "" || st.WALStatus == "lost" {
		t.Fatalf("slot after the recovery: %+v, %v", st, err)
	}
}

// The same workload (JSON and binary payloads, metadata, aggregate fields,
// several events per transaction, many keys) through the polling relay on
// one schema and the CDC relay on another: the two topics receive the same
// events, byte for byte, in the same order per key.
func TestCDCAndPollingRelaysAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	pollDB := pgtest.New(t)
	pollW := newWriter(t, pollDB)
	b := cdcSetup(t, pgtest.New(t))
	pollTopic := kafkatest.Topic()

	var workload [][]outbox.Event
	for tx := range 400 {
		var evs []outbox.Event
		for j := range 1 + tx%5 {
			seq := tx*10 + j
			e := outbox.Event{
				ID: watermill.NewUUID(), PartitionKey: fmt.Sprintf("key-%d", seq%37), EventType: "T",
				AggregateType: "order", AggregateID: fmt.Sprint(seq % 11),
				Payload:  fmt.Appendf(nil, `{"seq": %d, "z": [1, 2.50, "\u00e9"], "a": {"b": null}}`, seq),
				Metadata: map[string]string{"n": fmt.Sprint(seq), "x": "é"},
			}
			if seq%7 == 0 {
				e.Binary, e.Payload = true, []byte{0, 1, 2, byte(seq), 0xff}
				e.Payload = append(e.Payload, fmt.Appendf(nil, `{"seq":%d}`, seq)...)
			}
			evs = append(evs, e)
		}
		workload = append(workload, evs)
	}
	write := func(w *outbox.Writer, topic string) {
		for _, evs := range workload {
			copies := make([]outbox.Event, len(evs))
			for i, e := range evs {
				e.Topic = topic
				copies[i] = e
			}
			if _, err := w.Write(ctx, copies...); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(pollW, pollTopic)
	write(b.w, b.topic)
	startRelay(t, pollDB, outbox.RelayConfig{Publisher: newKafkaPublisher(t, brokers), Logger: testLogger(t)})
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: b.db.Schema, Publisher: newKafkaPublisher(t, brokers), Logger: testLogger(t)}})
	total := 0
	for _, evs := range workload {
		total += len(evs)
	}
	pollMsgs := kafkatest.Read(t, brokers, pollTopic, total)
	cdcMsgs := kafkatest.Read(t, brokers, b.topic, total)
	render := func(msgs []*message.Message) map[string][]string {
		byKey := map[string][]string{}
		seen := map[string]bool{}
		for _, m := range msgs {
			if seen[m.UUID] {
				continue
			}
			seen[m.UUID] = true
			key, _ := wkafka.MessageKeyFromCtx(m.Context())
			byKey[string(key)] = append(byKey[string(key)], fmt.Sprintf("%s %q %v", m.UUID, m.Payload, m.Metadata))
		}
		return byKey
	}
	pk, ck := render(pollMsgs), render(cdcMsgs)
	if len(pk) != 37 || len(ck) != len(pk) {
		t.Fatalf("%d keys by polling, %d by CDC, want 37", len(pk), len(ck))
	}
	for key, want := range pk {
		got := ck[key]
		if len(got) != len(want) {
			t.Fatalf("key %s: %d events by CDC, %d by polling", key, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("key %s event %d:\nCDC     %s\npolling %s", key, i, got[i], want[i])
			}
		}
	}
}

// logSlots logs, for a CDC test that failed, where the database's
// replication slots stand against the server's WAL: a CDC relay that
// published nothing was either not streaming (inactive) or far behind.
func logSlots(t testing.TB, db *pgtest.DB) {
	rows, err := db.Pool.Query(context.Background(), `SELECT slot_name, active, coalesce(confirmed_flush_lsn::text, ''),
		coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint, coalesce(wal_status, '')
		FROM pg_replication_slots WHERE database = current_database() ORDER BY slot_name`)
	if err != nil {
		t.Logf("slots not read: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var name, flushed, status string
		var active bool
		var behind int64
		if err := rows.Scan(&name, &active, &flushed, &behind, &status); err != nil {
			t.Logf("slots not read: %v", err)
			return
		}
		t.Logf("slot %s: active %v, confirmed %s, %d bytes of WAL behind, wal_status %q", name, active, flushed, behind, status)
	}
}
