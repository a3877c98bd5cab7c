package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
)

// Sizes shared by the groups.
const (
	keys        = 1000 // distinct partition keys of the backlog
	payloadSize = 100  // bytes of each event's JSON payload
	writeBatch  = 1000 // events per transaction when filling a backlog
	produceSize = 1000 // records per SendMessages call of the raw producer
)

// bench is one run: where PostgreSQL and Kafka are, and what was measured.
type bench struct {
	opts    *options
	dbURL   string
	brokers []string
	broker  *brokerProcess // nil with KAFKA_BROKERS
	logMu   sync.Mutex     // serializes progress lines
	log     io.Writer
	start   time.Time

	results map[string]float64
	config  map[string]any
	notes   []string
}

func newBench(ctx context.Context, o *options, stderr io.Writer) (*bench, error) {
	b := &bench{
		opts:    o,
		dbURL:   pgtest.URL(),
		log:     stderr,
		start:   time.Now(),
		results: map[string]float64{},
		config: map[string]any{
			"n":           o.n,
			"keys":        keys,
			"payload_b":   payloadSize,
			"duration_s":  o.duration.Seconds(),
			"groups":      o.only,
			"write_batch": writeBatch,
		},
	}
	// Fail early, naming the address, when PostgreSQL is not there.
	pool, err := pgtest.Connect(ctx, b.dbURL, 1)
	if err != nil {
		return nil, err
	}
	var pgVersion string
	err = pool.QueryRow(ctx, `SHOW server_version`).Scan(&pgVersion)
	pool.Close()
	if err != nil {
		return nil, err
	}
	b.config["postgres"] = pgVersion
	b.config["cpus"] = runtime.NumCPU()
	b.config["load_avg_start"] = loadAverage()
	wake, err := machineWakeup(ctx)
	if err != nil {
		return nil, err
	}
	b.config["machine_wakeup_round_trip_us"] = round(float64(wake)/float64(time.Microsecond), 1)
	probe := cpuProbe()
	b.config["machine_cpu_probe_ms"] = ms(probe)
	b.progress("machine: a round trip to another process (two wake-ups) takes %s (median of %d); the CPU probe takes %s (median of %d)",
		wake.Round(time.Microsecond/10), wakeupRoundTrips, probe.Round(time.Microsecond), cpuProbeRuns)

	if env := devkafka.EnvBrokers(); env != nil {
		b.brokers = env
		b.config["broker"] = "KAFKA_BROKERS"
		b.progress("Kafka: KAFKA_BROKERS=%s", strings.Join(env, ","))
	} else {
		bp, err := startBroker(ctx)
		if err != nil {
			return nil, err
		}
		b.broker, b.brokers = bp, []string{bp.addr}
		b.config["broker"] = "embedded kfake, separate process"
		b.progress("Kafka: embedded broker in child process %d at %s", bp.cmd.Process.Pid, bp.addr)
	}
	return b, nil
}

func (b *bench) close() {
	if b.broker != nil {
		b.broker.stop()
	}
}

// progress writes one line to stderr, stamped with the time since start.
func (b *bench) progress(format string, args ...any) {
	b.logMu.Lock()
	defer b.logMu.Unlock()
	fmt.Fprintf(b.log, "[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

func (b *bench) note(format string, args ...any) {
	b.notes = append(b.notes, fmt.Sprintf(format, args...))
}

// connect opens a pool of at most maxConns connections on DATABASE_URL.
func (b *bench) connect(ctx context.Context, maxConns int32) (*pgxpool.Pool, error) {
	return pgtest.Connect(ctx, b.dbURL, maxConns)
}

// workspace is what every figure group starts from: a pool of at most
// maxConns connections and a fresh schema with millrace's migrations
// applied. done drops the schema, then closes the pool; call it once
// nothing uses the pool any more.
func (b *bench) workspace(ctx context.Context, maxConns int32) (pool *pgxpool.Pool, schema string, done func(), err error) {
	return b.workspaceCounting(ctx, maxConns, nil)
}

// workspaceCounting is workspace with the pool's round trips counted in
// trips, unless nil.
func (b *bench) workspaceCounting(ctx context.Context, maxConns int32, trips *pgtest.RoundTrips) (pool *pgxpool.Pool, schema string, done func(), err error) {
	if trips != nil {
		pool, err = pgtest.ConnectTraced(ctx, b.dbURL, maxConns, trips)
	} else {
		pool, err = b.connect(ctx, maxConns)
	}
	if err != nil {
		return nil, "", nil, err
	}
	schema = pgtest.RandomName("bench")
	drop := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if _, err := pool.Exec(dctx, `DROP SCHEMA IF EXISTS `+sqlident.Quote(schema)+` CASCADE`); err != nil {
			b.progress("warning: drop schema %s: %v", schema, err)
		}
	}
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err != nil {
		pool.Close()
		return nil, "", nil, err
	}
	if _, err := m.Up(ctx); err != nil {
		drop()
		pool.Close()
		return nil, "", nil, fmt.Errorf("migrate %s: %w", schema, err)
	}
	return pool, schema, func() { drop(); pool.Close() }, nil
}

// newTopic returns a topic name no other run uses.
func newTopic(group string) string { return pgtest.RandomName("bench_" + group) }

// keyOf is the partition key of the i-th event.
func keyOf(i int) string { return fmt.Sprintf("key-%04d", i%keys) }

// payloadOf is the i-th event's JSON payload: payloadSize bytes, written the
// way PostgreSQL prints jsonb (keys by length, ": " and ", "), so that what
// the relay reads back has the same size as what the raw producer sends.
func payloadOf(i int) []byte {
	head := fmt.Sprintf(`{"n": %d, "key": "%s", "note": "`, i, keyOf(i))
	tail := `", "currency": "EUR"}`
	pad := max(payloadSize-len(head)-len(tail), 0)
	return []byte(head + strings.Repeat("x", pad) + tail)
}

// eventOf is the i-th backlog event.
func eventOf(topic string, i int) outbox.Event {
	k := keyOf(i)
	return outbox.Event{
		Topic:         topic,
		PartitionKey:  k,
		AggregateType: "order",
		AggregateID:   k,
		EventType:     "OrderPlaced",
		Payload:       payloadOf(i),
	}
}

// messageOf is the i-th event as the relay publishes it: the same UUID,
// metadata and payload (see outbox's pendingRow.message).
func messageOf(id string, i int) *message.Message {
	k := keyOf(i)
	msg := message.NewMessage(id, payloadOf(i))
	msg.Metadata.Set(core.MetadataEventID, id)
	msg.Metadata.Set(core.MetadataPartitionKey, k)
	msg.Metadata.Set(core.MetadataContentType, core.ContentTypeJSON)
	msg.Metadata.Set(core.MetadataEventType, "OrderPlaced")
	msg.Metadata.Set(core.MetadataAggregateType, "order")
	msg.Metadata.Set(core.MetadataAggregateID, k)
	return msg
}

// writeBacklog writes n events to the outbox in transactions of writeBatch
// events, from a few writers at once, with a Writer of cfg (its Schema set
// to schema).
func (b *bench) writeBacklog(ctx context.Context, pool *pgxpool.Pool, schema, topic string, n int, cfg outbox.WriterConfig) error {
	cfg.Schema = schema
	w, err := outbox.NewWriter(pool, cfg)
	if err != nil {
		return err
	}
	return b.inBatches(ctx, "backlog", n, func(ctx context.Context, from, to int) error {
		events := make([]outbox.Event, 0, to-from)
		for i := from; i < to; i++ {
			events = append(events, eventOf(topic, i))
		}
		_, err := w.Write(ctx, events...)
		return err
	})
}

// inBatches calls fn for [0,n) in slices of writeBatch from 4 goroutines,
// and reports progress every 10%.
func (b *bench) inBatches(ctx context.Context, what string, n int, fn func(ctx context.Context, from, to int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	started := time.Now()
	tenth := int64(max(n/10, 1))
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				from := int(next.Add(writeBatch)) - writeBatch
				if from >= n {
					return
				}
				to := min(from+writeBatch, n)
				if err := fn(ctx, from, to); err != nil {
					cancel(err)
					return
				}
				d := done.Add(int64(to - from))
				if d/tenth != (d-int64(to-from))/tenth {
					b.progress("%s: %d/%d written", what, d, n)
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	b.progress("%s: %d events in %s (not timed)", what, n, time.Since(started).Round(time.Millisecond))
	return nil
}

// topicRecords returns how many records topic holds, summed over its
// partitions (newest minus oldest offset).
func topicRecords(brokers []string, topic string) (int64, error) {
	client, err := sarama.NewClient(brokers, kafkatest.SaramaSubscriberConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	var total int64
	for _, p := range parts {
		newest, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, err
		}
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return 0, err
		}
		total += newest - oldest
	}
	return total, nil
}

// checkDelivered fails unless topic holds at least want records, and
// returns how many it holds.
func (b *bench) checkDelivered(topic string, want int) (int64, error) {
	got, err := topicRecords(b.brokers, topic)
	if err != nil {
		return 0, fmt.Errorf("count records of %s: %w", topic, err)
	}
	if got < int64(want) {
		return got, fmt.Errorf("topic %s holds %d records, want at least %d", topic, got, want)
	}
	b.progress("checked: topic holds %d records", got)
	return got, nil
}

// loadAverage is the 1-minute load average, or -1 if unknown.
func loadAverage() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// countingPublisher counts the messages its Publisher delivered.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	p.n.Add(int64(len(msgs) - failedCount(err, len(msgs))))
	return err
}

// PublishTopics passes the relay's calls for several topics through.
func (p *countingPublisher) PublishTopics(byTopic map[string][]*message.Message) error {
	err := publishTopics(p.Publisher, byTopic)
	n := 0
	for _, msgs := range byTopic {
		n += len(msgs)
	}
	p.n.Add(int64(n - failedCount(err, n)))
	return err
}

// publishTopics sends byTopic in one call when pub is an
// outbox.TopicsPublisher, else in a Publish call per topic, their
// failures merged into one *core.BatchError. The bench's wrappers of
// the relay's publisher pass PublishTopics through with it.
func publishTopics(pub message.Publisher, byTopic map[string][]*message.Message) error {
	if tp, ok := pub.(outbox.TopicsPublisher); ok {
		return tp.PublishTopics(byTopic)
	}
	var failed []core.MessageError
	for topic, msgs := range byTopic {
		err := pub.Publish(topic, msgs...)
		if err == nil {
			continue
		}
		var be *core.BatchError
		if !errors.As(err, &be) {
			return err
		}
		failed = append(failed, be.Errors...)
	}
	if len(failed) > 0 {
		return &core.BatchError{Errors: failed}
	}
	return nil
}

// failedUUIDs is the set of UUIDs a Publish error says failed, and false
// when the error fails the whole call.
func failedUUIDs(err error) (map[string]bool, bool) {
	failed := map[string]bool{}
	if err == nil {
		return failed, true
	}
	var be *core.BatchError
	if !errors.As(err, &be) {
		return nil, false
	}
	for _, me := range be.Errors {
		failed[me.UUID] = true
	}
	return failed, true
}

// failedCount is how many of n messages a Publish error says failed.
func failedCount(err error, n int) int {
	if err == nil {
		return 0
	}
	var be *core.BatchError
	if errors.As(err, &be) {
		return len(be.Errors)
	}
	return n
}

// median of xs (which it sorts).
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// percentile is the nearest-rank percentile p (0..1) of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 2) }

// forEach runs fn in workers goroutines for d and returns how many
// operations they completed (fn returns how many it did) and the time it
// took. The first error stops all of them.
func forEach(ctx context.Context, workers int, d time.Duration, fn func(ctx context.Context, worker int) (int, error)) (int64, time.Duration, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var ops atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	started := time.Now()
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				n, err := fn(ctx, w)
				if err != nil {
					cancel(err)
					return
				}
				ops.Add(int64(n))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(started)
	if err := context.Cause(ctx); err != nil {
		return 0, 0, err
	}
	return ops.Load(), elapsed, nil
}
