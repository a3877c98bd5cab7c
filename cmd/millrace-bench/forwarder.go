package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/sqlident"
)

// Past this projected time for the whole backlog the forwarder is measured
// over its first forwarderCap messages only: it is a rate. The limit is
// generous because the rate is not even: watermill-sql's query gets cheaper
// as the backlog shrinks, so the first messages are the slowest and a
// capped run understates the baseline.
const (
	forwarderMaxTime = 4 * time.Minute
	forwarderCap     = 50_000
	// forwarderMaxStall ends the measurement with an error when nothing is
	// forwarded for this long: watermill-sql's PostgreSQL subscriber reads
	// only rows below pg_snapshot_xmin, so any transaction left open
	// anywhere in the cluster stalls it.
	forwarderMaxStall = 2 * time.Minute
)

// benchForwarder measures forwarder_events_per_s: the same backlog through
// watermill-sql v4 (PostgreSQL schema and offsets adapters over pgx) and
// Watermill's Forwarder to a watermill-kafka v3 Publisher, the way the
// Watermill documentation builds an outbox.
func (b *bench) benchForwarder(ctx context.Context) error {
	pool, schema, done, err := b.workspace(ctx, 8)
	if err != nil {
		return err
	}
	defer done()
	topic := newTopic("forwarder")
	forwarderTopic := "forwarder"
	n := b.opts.n

	db := wsql.BeginnerFromPgx(pool)
	schemaAdapter := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return sqlident.Table(schema, "watermill_"+topic) },
	}
	offsetsAdapter := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return sqlident.Table(schema, "watermill_offsets_"+topic)
		},
	}
	sqlPub, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: schemaAdapter, AutoInitializeSchema: true}, nil)
	if err != nil {
		return err
	}
	defer sqlPub.Close()
	in := forwarder.NewPublisher(sqlPub, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
	err = b.inBatches(ctx, "forwarder backlog", n, func(ctx context.Context, from, to int) error {
		msgs := make([]*message.Message, 0, to-from)
		for i := from; i < to; i++ {
			msgs = append(msgs, messageOf(uuid.Must(uuid.NewV7()).String(), i))
		}
		return in.Publish(topic, msgs...)
	})
	if err != nil {
		return err
	}

	sub, err := wsql.NewSubscriber(db, wsql.SubscriberConfig{
		ConsumerGroup:    "bench",
		SchemaAdapter:    schemaAdapter,
		OffsetsAdapter:   offsetsAdapter,
		InitializeSchema: true,
	}, nil)
	if err != nil {
		return err
	}
	defer sub.Close()
	// A sync producer with millrace's producer settings and partitioning,
	// as watermill-kafka users would configure it.
	kp, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers:               b.brokers,
		Marshaler:             kafkatest.WatermillMarshaler(),
		OverwriteSaramaConfig: kafkatest.SaramaConfig(),
	}, nil)
	if err != nil {
		return err
	}
	defer kp.Close()
	out := &countingPublisher{Publisher: kp}
	fwd, err := forwarder.NewForwarder(sub, out, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: forwarderTopic, CloseTimeout: 10 * time.Second})
	if err != nil {
		return err
	}

	b.progress("forwarder: forwarding %d events", n)
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	finished := make(chan error, 1)
	started := time.Now()
	go func() { finished <- fwd.Run(fctx) }()
	target := int64(n)
	capped := false
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	lastReport, lastProgress, lastCount := started, started, int64(0)
	var count int64
	var elapsed time.Duration
wait:
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-finished:
			return fmt.Errorf("forwarder stopped after %d of %d: %v", out.n.Load(), target, err)
		case now := <-tick.C:
			count, elapsed = out.n.Load(), now.Sub(started)
			if count >= target {
				break wait
			}
			if !capped && elapsed > 5*time.Second && count > 0 &&
				time.Duration(float64(elapsed)*float64(n)/float64(count)) > forwarderMaxTime {
				capped, target = true, int64(min(n, forwarderCap))
				b.progress("forwarder: the whole backlog would take over %s; measuring the first %d", forwarderMaxTime, target)
				if count >= target {
					break wait
				}
			}
			if count > lastCount {
				lastCount, lastProgress = count, now
			}
			if now.Sub(lastReport) >= 5*time.Second {
				lastReport = now
				b.progress("forwarder: %d/%d forwarded (%.0f/s)", count, target, float64(count)/elapsed.Seconds())
				if stalled := now.Sub(lastProgress); stalled >= 5*time.Second {
					blocker := oldestTransaction(ctx, pool)
					b.progress("forwarder: no progress for %s; watermill-sql reads only rows older than the oldest transaction running in the cluster: %s",
						stalled.Round(time.Second), blocker)
					if stalled >= forwarderMaxStall {
						return fmt.Errorf("forwarder made no progress for %s (%d of %d forwarded); oldest transaction: %s",
							stalled.Round(time.Second), count, target, blocker)
					}
				}
			}
		}
	}
	if err := fwd.Close(); err != nil {
		return err
	}
	stop()
	<-finished
	if _, err := b.checkDelivered(topic, int(count)); err != nil {
		return err
	}
	rate := float64(count) / elapsed.Seconds()
	b.results["forwarder_events_per_s"] = round(rate, 0)
	b.config["forwarder_measured"] = count
	if capped {
		b.note("forwarder measured over its first %d of %d events (the whole backlog would take over %s)", count, n, forwarderMaxTime)
	}
	b.progress("forwarder: %d events in %s = %.0f/s", count, elapsed.Round(time.Millisecond), rate)
	return nil
}

// oldestTransaction describes the oldest transaction with an xid in the
// cluster, the one that holds pg_snapshot_xmin back.
func oldestTransaction(ctx context.Context, pool *pgxpool.Pool) string {
	var pid int
	var db, app, query string
	var age time.Duration
	err := pool.QueryRow(ctx, `SELECT pid, coalesce(datname, ''), application_name, now() - xact_start, left(query, 80)
  FROM pg_stat_activity
 WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()
 ORDER BY xact_start LIMIT 1`).Scan(&pid, &db, &app, &age, &query)
	if err != nil {
		return "none found (" + err.Error() + ")"
	}
	return fmt.Sprintf("pid %d, database %q, application %q, open for %s, last query %q", pid, db, app, age.Round(time.Second), query)
}
