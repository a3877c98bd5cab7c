// Command drive is the Go half of bench/debezium/run.sh: it prepares the
// PostgreSQL side for Debezium's PostgreSQL connector (a schema with an
// outbox table in the shape of millrace's outbox_event, a publication and a
// logical replication slot), writes the backlog, watches the topic fill,
// measures commit-to-consumer latency, merges the figures into the results
// file and cleans up. It is a measurement helper, not part of millrace.
//
//	drive setup    -schema S -slot L -pub P -topic T -n N     create, then write the backlog
//	drive connprops -schema S -slot L -pub P                  the connector's database properties
//	drive drain    -topic T -n N -since UNIX_NS -out F         wait until T holds N records
//	drive latency  -schema S -topic T -duration D -out F       paced commits vs. records seen
//	drive write    -schema S -topic T -duration D -out F       business tx + outbox row vs. + plain row
//	drive report   -out results.json -part F... k=v...         merge figures and config
//	drive cleanup  -schema S -slot L -pub P -topic T           drop the slot, publication, schema, topic
//
// PostgreSQL is DATABASE_URL, Kafka is KAFKA_BROKERS.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/internal/sqlident"
)

// The backlog and the latency phase are those of cmd/millrace-bench.
const (
	keys           = 1000 // partition keys
	payloadSize    = 100  // bytes of JSON payload
	writeBatch     = 1000 // events per backlog transaction
	latencyRate    = 1000 // events per second
	latencyWriters = 8
	partitions     = 8 // the cluster's num.partitions
)

type options struct {
	schema, slot, pub, topic, out string
	n                             int
	since                         int64
	pid                           int
	duration, timeout             time.Duration
	parts                         multi
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: drive setup|connprops|drain|latency|report|cleanup [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	var o options
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	fs.StringVar(&o.schema, "schema", "", "schema of the outbox table")
	fs.StringVar(&o.slot, "slot", "", "logical replication slot")
	fs.StringVar(&o.pub, "pub", "", "publication")
	fs.StringVar(&o.topic, "topic", "", "Kafka topic the router writes to")
	fs.StringVar(&o.out, "out", "", "where to write the figures (JSON)")
	fs.IntVar(&o.n, "n", 200000, "backlog size")
	fs.Int64Var(&o.since, "since", 0, "drain: the Unix time in ns the timing starts at")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "latency: the paced phase")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "drain: give up after this long")
	fs.Var(&o.parts, "part", "report: a JSON file of figures to merge (repeatable)")
	fs.IntVar(&o.pid, "pid", 0, "drain: fail as soon as this process (Connect) is gone")
	_ = fs.Parse(os.Args[2:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd {
	case "setup":
		err = setup(ctx, &o)
	case "connprops":
		err = connProps()
	case "drain":
		err = drain(ctx, &o)
	case "latency":
		err = latency(ctx, &o)
	case "write":
		err = write(ctx, &o)
	case "report":
		err = report(&o, fs.Args())
	case "cleanup":
		err = cleanup(ctx, &o)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "drive %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench-debezium: "+format+"\n", args...)
}

func brokers() ([]string, error) {
	b := os.Getenv("KAFKA_BROKERS")
	if b == "" {
		return nil, errors.New("KAFKA_BROKERS is not set")
	}
	return strings.Split(b, ","), nil
}

func connect(ctx context.Context, conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.MaxConns = conns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// keyOf and payloadOf are cmd/millrace-bench's: 1,000 keys, 100-byte
// payloads written the way PostgreSQL prints jsonb.
func keyOf(i int) string { return fmt.Sprintf("key-%04d", i%keys) }

func payloadOf(i int) string {
	head := fmt.Sprintf(`{"n": %d, "key": "%s", "note": "`, i, keyOf(i))
	tail := `", "currency": "EUR"}`
	pad := max(payloadSize-len(head)-len(tail), 0)
	return head + strings.Repeat("x", pad) + tail
}

// outboxTable is millrace's outbox_event without the relay's bookkeeping
// columns (lane, published_at, attempts, ...): what a Debezium outbox needs.
const outboxTable = `CREATE TABLE %s (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    aggregate_type text        NOT NULL DEFAULT '',
    aggregate_id   text        NOT NULL DEFAULT '',
    event_type     text        NOT NULL DEFAULT '',
    topic          text        NOT NULL CHECK (topic <> ''),
    partition_key  text        NOT NULL CHECK (partition_key <> ''),
    payload        jsonb,
    headers        jsonb       NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT now()
)`

const insertEvent = `INSERT INTO %s (event_id, aggregate_type, aggregate_id, event_type, topic, partition_key, payload)
VALUES ($1, 'order', $2, 'OrderPlaced', $3, $2, $4)`

func table(o *options) string { return sqlident.Table(o.schema, "outbox_event") }

// setup creates the schema, table, publication and slot (slot first, so
// the backlog written next is in its stream), the topic, then the backlog.
func setup(ctx context.Context, o *options) error {
	pool, err := connect(ctx, 5)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, q := range []string{
		`CREATE SCHEMA ` + sqlident.Quote(o.schema),
		fmt.Sprintf(outboxTable, table(o)),
		`CREATE PUBLICATION ` + sqlident.Quote(o.pub) + ` FOR TABLE ` + table(o) + ` WITH (publish = 'insert')`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(q, "(", 2)[0], err)
		}
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, o.slot); err != nil {
		return fmt.Errorf("create slot: %w", err)
	}
	if err := createTopic(ctx, o.topic); err != nil {
		return err
	}
	say("schema %s, publication %s, slot %s, topic %s (%d partitions) created", o.schema, o.pub, o.slot, o.topic, partitions)
	if o.out != "" {
		var version, walLevel string
		if err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('wal_level')`).Scan(&version, &walLevel); err != nil {
			return err
		}
		if err := writeJSON(o.out, map[string]any{"postgres": version, "wal_level": walLevel, "n": o.n, "keys": keys, "payload_bytes": payloadSize, "write_batch": writeBatch, "partitions": partitions}); err != nil {
			return err
		}
	}

	started := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for {
				from := int(next.Add(writeBatch)) - writeBatch
				if from >= o.n || ctx.Err() != nil {
					return
				}
				to := min(from+writeBatch, o.n)
				rows := make([][]any, 0, to-from)
				for i := from; i < to; i++ {
					k := keyOf(i)
					rows = append(rows, []any{uuid.New(), "order", k, "OrderPlaced", o.topic, k, payloadOf(i)})
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.CopyFrom(ctx, pgx.Identifier{o.schema, "outbox_event"},
						[]string{"event_id", "aggregate_type", "aggregate_id", "event_type", "topic", "partition_key", "payload"},
						pgx.CopyFromRows(rows))
					return err
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	say("backlog: %d events in transactions of %d in %s (not timed)", o.n, writeBatch, time.Since(started).Round(time.Millisecond))
	return nil
}

// connProps prints the connector's database.* properties from DATABASE_URL.
func connProps() error {
	cfg, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	fmt.Printf("database.hostname=%s\ndatabase.port=%d\ndatabase.user=%s\ndatabase.password=%s\ndatabase.dbname=%s\n",
		cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database)
	return nil
}

func client(opts ...kgo.Opt) (*kgo.Client, error) {
	b, err := brokers()
	if err != nil {
		return nil, err
	}
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b...)}, opts...)...)
}

func createTopic(ctx context.Context, topic string) error {
	cl, err := client()
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = topic, partitions, 3
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for _, r := range resp.Topics {
		if err := kerrOf(r.ErrorCode); err != nil {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return nil
}

// highWater returns the topic's newest offset per partition.
func highWater(ctx context.Context, cl *kgo.Client, topic string) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.IsolationLevel = 0
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = topic
	for p := range int32(partitions) {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = p, -1 // latest
		t.Partitions = append(t.Partitions, lp)
	}
	req.Topics = append(req.Topics, t)
	shards := cl.RequestSharded(ctx, req)
	hw := map[int32]int64{}
	for _, s := range shards {
		if s.Err != nil {
			return nil, s.Err
		}
		for _, rt := range s.Resp.(*kmsg.ListOffsetsResponse).Topics {
			for _, rp := range rt.Partitions {
				if err := kerrOf(rp.ErrorCode); err != nil {
					return nil, fmt.Errorf("offsets of %s/%d: %w", topic, rp.Partition, err)
				}
				hw[rp.Partition] = rp.Offset
			}
		}
	}
	if len(hw) != partitions {
		return nil, fmt.Errorf("offsets of %s: %d of %d partitions answered", topic, len(hw), partitions)
	}
	return hw, nil
}

func sum(hw map[int32]int64) (n int64) {
	for _, v := range hw {
		n += v
	}
	return n
}

func kerrOf(code int16) error {
	if code == 0 {
		return nil
	}
	return fmt.Errorf("kafka error code %d", code)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// drain polls the topic's high-water marks every 20 ms until they sum to n
// and writes the time from -since (Connect's start) and from the first
// record.
func drain(ctx context.Context, o *options) error {
	cl, err := client()
	if err != nil {
		return err
	}
	defer cl.Close()
	start := time.Unix(0, o.since)
	deadline := time.Now().Add(o.timeout)
	var first time.Time
	lastSay := time.Now()
	for {
		hw, err := highWater(ctx, cl, o.topic)
		if err != nil {
			return err
		}
		got := sum(hw)
		now := time.Now()
		if got > 0 && first.IsZero() {
			first = now
			say("drain: first records after %s", now.Sub(start).Round(time.Millisecond))
		}
		if got >= int64(o.n) {
			total, streaming := now.Sub(start), now.Sub(first)
			say("drain: %d records after %s from Connect's start (%.0f/s), %s from the first record (%.0f/s)",
				got, total.Round(time.Millisecond), float64(o.n)/total.Seconds(),
				streaming.Round(time.Millisecond), float64(o.n)/streaming.Seconds())
			return writeJSON(o.out, map[string]any{
				"debezium_events_per_s":           round(float64(o.n)/total.Seconds(), 0),
				"debezium_streaming_events_per_s": round(float64(o.n)/streaming.Seconds(), 0),
				"debezium_first_record_s":         round(first.Sub(start).Seconds(), 2),
				"debezium_drain_records":          got,
			})
		}
		if now.After(deadline) {
			return fmt.Errorf("topic %s holds %d of %d records after %s", o.topic, got, o.n, o.timeout)
		}
		if o.pid > 0 && syscall.Kill(o.pid, 0) != nil {
			return fmt.Errorf("Kafka Connect (pid %d) exited with %d of %d records in %s", o.pid, got, o.n, o.topic)
		}
		if now.Sub(lastSay) >= 5*time.Second {
			say("drain: %d/%d records after %s", got, o.n, now.Sub(start).Round(time.Second))
			lastSay = now
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling the broker, not waiting on a result
		}
	}
}

// latency commits one event per transaction at 1,000/s from 8 writers for
// the phase and consumes the topic from its current end; an event's latency
// is the time the consumer saw its record minus the time Commit returned to
// its writer (0 if the record came first). Records are matched by the
// router's "id" header (the event_id column).
func latency(ctx context.Context, o *options) error {
	pool, err := connect(ctx, latencyWriters+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	admin, err := client()
	if err != nil {
		return err
	}
	hw, err := highWater(ctx, admin, o.topic)
	admin.Close()
	if err != nil {
		return err
	}
	offsets := map[int32]kgo.Offset{}
	for p, off := range hw {
		offsets[p] = kgo.NewOffset().At(off)
	}
	cl, err := client(
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{o.topic: offsets}),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer cl.Close()

	var mu sync.Mutex
	seen := map[string]time.Time{}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumed := make(chan error, 1)
	go func() {
		for {
			fetches := cl.PollFetches(cctx)
			now := time.Now()
			if cctx.Err() != nil {
				consumed <- nil
				return
			}
			if err := fetches.Err(); err != nil {
				consumed <- err
				return
			}
			var bad error
			mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) {
				// The router's mapping, checked on every record: key =
				// partition_key, value = the payload, id and event_type headers.
				var id, eventType string
				for _, h := range r.Headers {
					switch h.Key {
					case "id":
						id = strings.Trim(string(h.Value), `"`)
					case "event_type":
						eventType = string(h.Value)
					}
				}
				if id == "" || eventType != "OrderPlaced" || !strings.Contains(string(r.Value), `"key": "`+string(r.Key)+`"`) {
					bad = fmt.Errorf("record at %s/%d@%d is not what the router should write: key %q, value %q, headers %v",
						r.Topic, r.Partition, r.Offset, r.Key, r.Value, r.Headers)
					return
				}
				if _, ok := seen[id]; !ok {
					seen[id] = now
				}
			})
			mu.Unlock()
			if bad != nil {
				consumed <- bad
				return
			}
		}
	}()
	defer func() { stopConsumer(); <-consumed }()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
	waitSeen := func(want int, d time.Duration) error {
		deadline := time.Now().Add(d)
		for count() < want {
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d records seen after %s", count(), want, d)
			}
			select {
			case err := <-consumed:
				return fmt.Errorf("consumer: %w", err)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond): // polling the consumer's map
			}
		}
		return nil
	}
	ins := fmt.Sprintf(insertEvent, table(o))
	write := func(ctx context.Context, i int) (string, error) {
		id := uuid.New()
		k := keyOf(i)
		_, err := pool.Exec(ctx, ins, id, k, o.topic, payloadOf(i))
		return id.String(), err
	}

	// Warm up (connections, the consumer's fetch sessions): not measured.
	for i := range 20 {
		if _, err := write(ctx, i); err != nil {
			return err
		}
	}
	if err := waitSeen(20, 60*time.Second); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	total := int(o.duration.Seconds() * latencyRate)
	commits := make([]struct {
		id string
		at time.Time
	}, total)
	jobs := make(chan int, total)
	wctx, cancelWriters := context.WithCancelCause(ctx)
	defer cancelWriters(nil)
	var wg sync.WaitGroup
	for range latencyWriters {
		wg.Go(func() {
			for i := range jobs {
				if wctx.Err() != nil {
					return
				}
				id, err := write(wctx, i)
				if err != nil {
					cancelWriters(err)
					return
				}
				commits[i].id, commits[i].at = id, time.Now()
			}
		})
	}
	say("latency: %d events, one per transaction, at %d/s", total, latencyRate)
	started := time.Now()
	interval := time.Second / latencyRate
	for i := range total {
		if d := time.Until(started.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d) // pacing, not waiting for a result
		}
		if wctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	written := time.Since(started)
	if err := context.Cause(wctx); err != nil {
		return err
	}
	if err := waitSeen(total+20, 120*time.Second); err != nil {
		return err
	}
	lat := make([]time.Duration, 0, total)
	mu.Lock()
	for _, c := range commits {
		lat = append(lat, max(seen[c.id].Sub(c.at), 0))
	}
	mu.Unlock()
	slices.Sort(lat)
	p50, p99 := percentile(lat, 0.50), percentile(lat, 0.99)
	rate := float64(total) / written.Seconds()
	say("latency: %d events at %.0f/s: p50 %s, p99 %s, max %s", total, rate, p50, p99, lat[len(lat)-1])
	return writeJSON(o.out, map[string]any{
		"debezium_latency_p50_ms":  ms(p50),
		"debezium_latency_p99_ms":  ms(p99),
		"debezium_latency_max_ms":  ms(lat[len(lat)-1]),
		"latency_rate_per_s":       round(rate, 0),
		"latency_events":           total,
		"latency_phase_s":          o.duration.Seconds(),
		"latency_measured_at":      "consumer (record fetched)",
		"latency_consumer_maxwait": "100ms",
	})
}

// write measures the write cost of the business transaction as
// cmd/millrace-bench's write_ratio does: 8 writers running one-row business
// transactions (uuid, text, jsonb) that also insert (a) one event into the
// Debezium outbox table or (b) one more plain row into a table of the
// business table's columns; a, b, a, b for the phase each, each after a
// CHECKPOINT; the medians and their ratio.
func write(ctx context.Context, o *options) error {
	pool, err := connect(ctx, latencyWriters+2)
	if err != nil {
		return err
	}
	defer pool.Close()
	business, plain := sqlident.Table(o.schema, "bench_business"), sqlident.Table(o.schema, "bench_plain")
	for _, t := range []string{business, plain} {
		if _, err := pool.Exec(ctx, `CREATE TABLE `+t+` (id uuid PRIMARY KEY, name text NOT NULL, data jsonb NOT NULL)`); err != nil {
			return err
		}
	}
	insBusiness := `INSERT INTO ` + business + ` (id, name, data) VALUES ($1, $2, $3)`
	insPlain := `INSERT INTO ` + plain + ` (id, name, data) VALUES ($1, $2, $3)`
	insEvent := fmt.Sprintf(insertEvent, table(o))
	variants := []struct {
		name string
		op   func(tx pgx.Tx, i int) error
	}{
		{"business tx + outbox row", func(tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, insEvent, uuid.New(), keyOf(i), o.topic, payloadOf(i))
			return err
		}},
		{"business tx + plain insert", func(tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, insPlain, uuid.Must(uuid.NewV7()), keyOf(i), payloadOf(i))
			return err
		}},
	}
	var rates [2][]float64
	for round := range 2 {
		for k, v := range variants {
			if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
				say("write: CHECKPOINT: %v (continuing)", err)
			}
			var ops atomic.Int64
			var next atomic.Int64
			wctx, cancel := context.WithCancelCause(ctx)
			deadline := time.Now().Add(o.duration)
			started := time.Now()
			var wg sync.WaitGroup
			for range latencyWriters {
				wg.Go(func() {
					for wctx.Err() == nil && time.Now().Before(deadline) {
						i := int(next.Add(1))
						err := pgx.BeginFunc(wctx, pool, func(tx pgx.Tx) error {
							if _, err := tx.Exec(wctx, insBusiness, uuid.Must(uuid.NewV7()), keyOf(i), payloadOf(i)); err != nil {
								return err
							}
							return v.op(tx, i)
						})
						if err != nil {
							cancel(err)
							return
						}
						ops.Add(1)
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(started)
			err := context.Cause(wctx)
			cancel(nil)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			rate := float64(ops.Load()) / elapsed.Seconds()
			rates[k] = append(rates[k], rate)
			say("write: round %d, %s: %.0f/s", round+1, v.name, rate)
		}
	}
	a, b := median(rates[0]), median(rates[1])
	say("write: outbox row %.0f/s, plain insert %.0f/s, ratio %.3f", a, b, a/b)
	return writeJSON(o.out, map[string]any{
		"debezium_write_tps_outbox": round(a, 0),
		"debezium_write_tps_plain":  round(b, 0),
		"debezium_write_ratio":      round(a/b, 3),
		"write_writers":             latencyWriters,
	})
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
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

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

// report merges the figures of each -part file into -out: the keys named
// debezium_* at the top level, the rest under "config", with the k=v
// arguments (numbers where they parse) added to config.
func report(o *options, kv []string) error {
	results := map[string]any{}
	config := map[string]any{}
	for _, p := range o.parts {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for k, v := range m {
			if strings.HasPrefix(k, "debezium_") {
				results[k] = v
			} else {
				config[k] = v
			}
		}
	}
	for _, a := range kv {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("report: %q is not key=value", a)
		}
		switch {
		case v == "true" || v == "false":
			config[k] = v == "true"
		default:
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				config[k] = f
			} else {
				config[k] = v
			}
		}
	}
	if rss, ok := config["rss_kib"].(float64); ok {
		results["debezium_rss_mib"] = round(rss/1024, 1)
		delete(config, "rss_kib")
	}
	if q, ok := config["quick"]; ok {
		results["quick"] = q
		delete(config, "quick")
	}
	results["time"] = time.Now().UTC().Format(time.RFC3339)
	results["config"] = config
	return writeJSON(o.out, results)
}

// cleanup drops the slot (waiting for Connect to let go of it: a leftover
// slot keeps WAL forever), the publication, the schema and the topic.
func cleanup(ctx context.Context, o *options) error {
	pool, err := connect(ctx, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	var errs []error
	if o.slot != "" {
		deadline := time.Now().Add(30 * time.Second)
		for {
			var active *bool
			err := pool.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, o.slot).Scan(&active)
			if errors.Is(err, pgx.ErrNoRows) {
				break
			}
			if err != nil {
				errs = append(errs, err)
				break
			}
			if !*active || time.Now().After(deadline) {
				if _, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, o.slot); err != nil {
					errs = append(errs, fmt.Errorf("drop slot %s: %w", o.slot, err))
				}
				break
			}
			time.Sleep(100 * time.Millisecond) // polling the slot's state with a deadline
		}
	}
	if o.pub != "" {
		if _, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+sqlident.Quote(o.pub)); err != nil {
			errs = append(errs, err)
		}
	}
	if o.schema != "" {
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+sqlident.Quote(o.schema)+` CASCADE`); err != nil {
			errs = append(errs, err)
		}
	}
	if o.topic != "" {
		if cl, err := client(); err == nil {
			req := kmsg.NewPtrDeleteTopicsRequest()
			req.TopicNames = []string{o.topic}
			t := kmsg.NewDeleteTopicsRequestTopic()
			t.Topic = &o.topic
			req.Topics = append(req.Topics, t)
			req.TimeoutMillis = 30000
			if _, err := req.RequestWith(ctx, cl); err != nil {
				errs = append(errs, fmt.Errorf("delete topic %s: %w", o.topic, err))
			}
			cl.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	say("cleaned up: slot %s, publication %s, schema %s, topic %s dropped", o.slot, o.pub, o.schema, o.topic)
	return nil
}
