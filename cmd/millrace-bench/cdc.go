package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// benchCDC measures the outbox in change-data-capture mode: the backlog
// drained by one CDCRelay (cdc_relay_events_per_s), the write ratio with a
// CDC-mode Writer (write_ratio_cdc) and commit-to-ack latency with a
// CDCRelay (cdc_latency_p50_ms, cdc_latency_p99_ms). Each measurement
// creates its schema's publication and slot and drops them at its end: a
// slot left behind keeps WAL forever.
func (b *bench) benchCDC(ctx context.Context) error {
	if err := b.cdcDrain(ctx); errors.Is(err, outbox.ErrWALLevel) {
		b.note("no CDC figures: %v", err)
		b.progress("cdc: skipped: %v", err)
		return nil
	} else if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	tpsA, tpsB, err := b.writeRatio(ctx, "write (CDC)", true)
	if err != nil {
		return fmt.Errorf("write ratio: %w", err)
	}
	b.results["write_ratio_cdc"] = round(tpsA/tpsB, 3)
	b.config["write_tps_outbox_cdc"] = round(tpsA, 0)
	b.config["write_tps_plain_cdc_run"] = round(tpsB, 0)
	p50, p99, err := b.latency(ctx, "latency (CDC)", latencyCDC)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	b.results["cdc_latency_p50_ms"], b.results["cdc_latency_p99_ms"] = ms(p50), ms(p99)
	return nil
}

// createCDC creates the schema's CDC publication and slot (Admin.CreateCDC)
// and returns the function that drops them.
func (b *bench) createCDC(ctx context.Context, pool *pgxpool.Pool, schema string) (drop func(), err error) {
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		return nil, err
	}
	drop = func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		// The server ends a stopped relay's walsender a moment after the
		// relay's Run returned: until then the slot is active and cannot
		// be dropped.
		err := waitFor(dctx, 30*time.Second, func() bool {
			s, err := admin.SlotStats(dctx, "")
			return err != nil || !s.Active
		})
		if err == nil {
			err = admin.DropCDC(dctx, "")
		}
		if err != nil {
			b.progress("warning: drop the CDC slot %s: %v (drop it by hand: it keeps WAL)", outbox.DefaultSlot(schema), err)
		}
	}
	if err := admin.CreateCDC(ctx, ""); err != nil {
		drop() // the publication may exist without the slot
		return nil, err
	}
	return drop, nil
}

// cdcDrain measures cdc_relay_events_per_s: the backlog of
// relay_events_per_s, written with a CDC-mode Writer after the slot was
// created, drained by one CDCRelay with its default config in the bench
// process (the polling relay runs in a child for its RSS; this figure has
// no RSS), publishing through kafka.Publisher. Time from Run until every
// event of the log is marked published.
func (b *bench) cdcDrain(ctx context.Context) error {
	pool, schema, done, err := b.workspace(ctx, 8)
	if err != nil {
		return err
	}
	defer done()
	dropCDC, err := b.createCDC(ctx, pool, schema)
	if err != nil {
		return err
	}
	defer dropCDC()
	topic := newTopic("cdc")
	n := b.opts.n
	if err := b.writeBacklog(ctx, pool, schema, topic, n, outbox.WriterConfig{CDC: true}); err != nil {
		return err
	}
	events, pending := sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending")
	if _, err := pool.Exec(ctx, `ANALYZE `+events+`, `+pending); err != nil {
		return err
	}

	kp, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.brokers}, nil)
	if err != nil {
		return err
	}
	defer kp.Close()
	pub := &countingPublisher{Publisher: kp}
	relay, err := outbox.NewCDCRelay(pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{
		Schema:    schema,
		Publisher: pub,
		Logger:    watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	}})
	if err != nil {
		return err
	}
	b.progress("cdc: draining %d events with one CDC relay in the bench process", n)
	rctx, stop := context.WithCancel(ctx)
	finished := make(chan struct{})
	var runErr error
	started := time.Now()
	go func() {
		defer close(finished)
		runErr = relay.Run(rctx)
	}()
	defer func() { stop(); <-finished }() // before dropCDC: a slot in use cannot be dropped

	// Once all n are out, probe every 2 ms until the log has no unpublished
	// event and the pending set is empty (a sequential scan of the log, run
	// only after the last publish).
	probe := `SELECT EXISTS (SELECT 1 FROM ` + events + ` WHERE published_at IS NULL AND discarded_at IS NULL)
    OR EXISTS (SELECT 1 FROM ` + pending + `)`
	var drained time.Time
	deadline := started.Add(15 * time.Minute)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for drained.IsZero() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-finished:
			return fmt.Errorf("CDC relay stopped before draining the backlog (%d of %d published): %v", pub.n.Load(), n, runErr)
		case now := <-tick.C:
			if now.After(deadline) {
				return fmt.Errorf("backlog not drained after 15 minutes (%d of %d published)", pub.n.Load(), n)
			}
		}
		if pub.n.Load() < int64(n) {
			continue
		}
		var left bool
		if err := pool.QueryRow(ctx, probe).Scan(&left); err != nil {
			return err
		}
		if !left {
			drained = time.Now()
		}
	}
	records, err := b.checkDelivered(topic, n)
	if err != nil {
		return err
	}
	if dup := records - int64(n); dup > 0 {
		b.config["cdc_relay_duplicates"] = dup
		b.note("the CDC relay published %d duplicates (topic holds %d records for %d events)", dup, records, n)
	}
	drain := drained.Sub(started)
	rate := float64(n) / drain.Seconds()
	b.results["cdc_relay_events_per_s"] = round(rate, 0)
	b.progress("cdc: %d events in %s = %.0f/s", n, drain.Round(time.Millisecond), rate)
	return nil
}
