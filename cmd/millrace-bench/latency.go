package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// The writers' pace: one event per transaction, latencyRate a second,
// handed out to latencyWriters goroutines so that a slow commit does not
// hold the pace back.
const (
	latencyRate    = 1000 // events per second
	latencyWriters = 8
)

// benchLatency measures latency_p50_ms and latency_p99_ms with a relay in
// its default configuration (LISTEN/NOTIFY hints, writer hints coalesced),
// then the baseline: the source documents' poller, which publishes up to
// 100 events and sleeps 500 ms, over and over.
func (b *bench) benchLatency(ctx context.Context) error {
	p50, p99, err := b.latency(ctx, "latency", latencyRelay)
	if err != nil {
		return err
	}
	b.results["latency_p50_ms"], b.results["latency_p99_ms"] = ms(p50), ms(p99)
	p50, p99, err = b.latency(ctx, "baseline (poll every 500ms)", latencyPoll)
	if err != nil {
		return err
	}
	b.results["baseline_poll_latency_p50_ms"], b.results["baseline_poll_latency_p99_ms"] = ms(p50), ms(p99)
	return nil
}

// ackRecorder notes when the broker acknowledged each message, by UUID.
type ackRecorder struct {
	message.Publisher
	mu   sync.Mutex
	acks map[string]time.Time
}

func (p *ackRecorder) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	p.acked(map[string][]*message.Message{topic: msgs}, err)
	return err
}

// PublishTopics passes the relay's calls for several topics through.
func (p *ackRecorder) PublishTopics(byTopic map[string][]*message.Message) error {
	err := publishTopics(p.Publisher, byTopic)
	p.acked(byTopic, err)
	return err
}

func (p *ackRecorder) acked(byTopic map[string][]*message.Message, err error) {
	now := time.Now()
	failed, ok := failedUUIDs(err)
	if !ok {
		return // nothing acknowledged
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, msgs := range byTopic {
		for _, m := range msgs {
			if !failed[m.UUID] {
				if _, seen := p.acks[m.UUID]; !seen {
					p.acks[m.UUID] = now
				}
			}
		}
	}
}

func (p *ackRecorder) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.acks)
}

// latencyMode is what ships the events of a latency run.
type latencyMode int

const (
	latencyRelay latencyMode = iota // an outbox.Relay, default config
	latencyPoll                     // pollEvery500ms, the baseline
	latencyCDC                      // an outbox.CDCRelay, default config, CDC-mode Writers
)

// latency runs one relay and paced writers for the phase duration and
// returns the p50 and p99 of commit-to-acknowledgement.
func (b *bench) latency(ctx context.Context, name string, mode latencyMode) (p50, p99 time.Duration, err error) {
	pool, schema, done, err := b.workspace(ctx, latencyWriters+6)
	if err != nil {
		return 0, 0, err
	}
	defer done()
	topic := newTopic("latency")

	kp, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.brokers}, nil)
	if err != nil {
		return 0, 0, err
	}
	defer kp.Close()
	rec := &ackRecorder{Publisher: kp, acks: map[string]time.Time{}}
	wcfg := outbox.WriterConfig{Schema: schema}
	var run func(ctx context.Context) error
	switch mode {
	case latencyPoll:
		wcfg.NotifyInterval = -1
		run = func(ctx context.Context) error { return pollEvery500ms(ctx, pool, schema, rec) }
	case latencyRelay:
		relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: rec})
		if err != nil {
			return 0, 0, err
		}
		run = relay.Run
	case latencyCDC:
		dropCDC, err := b.createCDC(ctx, pool, schema)
		if err != nil {
			return 0, 0, err
		}
		defer dropCDC() // after the relay has stopped (deferred below)
		wcfg.CDC = true
		relay, err := outbox.NewCDCRelay(pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: schema, Publisher: rec}})
		if err != nil {
			return 0, 0, err
		}
		run = relay.Run
	}
	w, err := outbox.NewWriter(pool, wcfg)
	if err != nil {
		return 0, 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	finished := make(chan struct{})
	var runErr error
	go func() {
		defer close(finished)
		runErr = run(rctx)
	}()
	defer func() { stop(); <-finished }()

	// Warm up (topic creation, metadata, connections): not measured.
	for i := range 20 {
		if _, err := w.Write(ctx, eventOf(topic, i)); err != nil {
			return 0, 0, err
		}
	}
	if err := waitFor(ctx, 30*time.Second, func() bool { return rec.count() >= 20 || isClosed(finished) }); err != nil {
		return 0, 0, fmt.Errorf("warm-up events not acknowledged: %w", err)
	}
	if isClosed(finished) {
		return 0, 0, fmt.Errorf("the relay stopped: %v", runErr)
	}

	// Paced writers: a ticker hands out one event per millisecond to a few
	// goroutines, each committing one event per transaction.
	total := int(b.opts.duration.Seconds() * latencyRate)
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
				ids, err := w.Write(wctx, eventOf(topic, i))
				if err != nil {
					cancelWriters(err)
					return
				}
				commits[i].id, commits[i].at = ids[0], time.Now()
			}
		})
	}
	b.progress("%s: %d events, one per transaction, at %d/s", name, total, latencyRate)
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
		return 0, 0, err
	}
	if err := waitFor(ctx, 60*time.Second, func() bool { return rec.count() >= total+20 }); err != nil {
		return 0, 0, fmt.Errorf("%d of %d events acknowledged: %w", rec.count()-20, total, err)
	}

	lat := make([]time.Duration, 0, total)
	rec.mu.Lock()
	for _, c := range commits {
		// A commit returns to the writer a moment after the row is visible;
		// a relay may beat it. Count such an event as 0.
		lat = append(lat, max(rec.acks[c.id].Sub(c.at), 0))
	}
	rec.mu.Unlock()
	slices.Sort(lat)
	p50, p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	rate := float64(total) / written.Seconds()
	key := [...]string{latencyRelay: "latency_rate_per_s", latencyPoll: "baseline_poll_rate_per_s", latencyCDC: "cdc_latency_rate_per_s"}[mode]
	b.config[key] = round(rate, 0)
	b.progress("%s: %d events at %.0f/s: p50 %s, p99 %s, max %s", name, total, rate, p50, p99, lat[len(lat)-1])
	return p50, p99, nil
}

// isClosed says whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not done within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// pollEvery500ms is the baseline poller of the source documents on
// millrace's tables: take up to 100 pending events with FOR UPDATE SKIP
// LOCKED, publish them, mark them published, commit, sleep 500 ms. Taken
// literally (one batch of 100 per sleep) it cannot keep up with 1,000
// events/s, so this one is generous: each poll takes everything pending
// when it starts, in batches of 100, then sleeps.
func pollEvery500ms(ctx context.Context, pool *pgxpool.Pool, schema string, pub message.Publisher) error {
	pending, events := sqlident.Table(schema, "outbox_pending"), sqlident.Table(schema, "outbox_event")
	claim := `SELECT e.id, e.event_id::text, e.topic, e.partition_key, e.payload
  FROM ` + pending + ` q JOIN ` + events + ` e ON e.id = q.id
 WHERE q.id <= $1
 ORDER BY q.id LIMIT 100 FOR UPDATE OF q SKIP LOCKED`
	mark := `WITH d AS (DELETE FROM ` + pending + ` WHERE id = ANY($1))
UPDATE ` + events + ` SET published_at = now() WHERE id = ANY($1)`
	var upTo int64 // the poll takes what was pending when it started
	for {
		if upTo == 0 {
			if err := pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+pending).Scan(&upTo); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		n := 0
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, claim, upTo)
			if err != nil {
				return err
			}
			var ids []int64
			byTopic := map[string][]*message.Message{}
			var id int64
			var eventID, topic, key string
			var payload []byte
			_, err = pgx.ForEachRow(rows, []any{&id, &eventID, &topic, &key, &payload}, func() error {
				msg := message.NewMessage(eventID, slices.Clone(payload))
				msg.Metadata.Set(core.MetadataPartitionKey, key)
				byTopic[topic] = append(byTopic[topic], msg)
				ids = append(ids, id)
				return nil
			})
			if err != nil || len(ids) == 0 {
				return err
			}
			for topic, msgs := range byTopic {
				if err := pub.Publish(topic, msgs...); err != nil {
					return err
				}
			}
			n = len(ids)
			_, err = tx.Exec(ctx, mark, ids)
			return err
		})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		upTo = 0
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
}
