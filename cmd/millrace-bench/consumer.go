package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
)

// consumerWorkers is how many goroutines take deliveries off each
// consumer's channel (batches of different partitions, or messages of
// different partitions, come concurrently).
const consumerWorkers = 4

// benchConsumer measures the consumer figures: a backlog of messages in a
// topic of 1 and of 32 partitions, consumed (a) by kafka.Subscriber's
// SubscribeBatch into a handler that marks a batch with
// inbox.Deduplicator.MarkTx and inserts one row per message, one
// transaction per batch, and (b) by watermill-kafka's sarama subscriber
// into inbox's per-message dedup middleware doing the same insert.
func (b *bench) benchConsumer(ctx context.Context) error {
	n := max(b.opts.n/4, 100)
	b.config["consumer_n"] = n
	b.config["consumer_workers"] = consumerWorkers
	for _, parts := range []int32{1, 32} {
		topic := newTopic(fmt.Sprintf("consumer_%dp", parts))
		dropTopic, err := b.createTopics(map[string]string{topic: topic}, parts)
		if err != nil {
			return err
		}
		defer dropTopic()
		if err := b.produceBacklog(ctx, topic, n); err != nil {
			return err
		}
		for _, batched := range []bool{true, false} {
			rate, err := b.consume(ctx, topic, n, batched)
			if err != nil {
				return fmt.Errorf("%d partitions: %w", parts, err)
			}
			name := "wkafka"
			if batched {
				name = "batched"
			}
			b.results[fmt.Sprintf("consumer_%s_%dp_per_s", name, parts)] = round(rate, 0)
			b.progress("consumer %s, %d partitions: %d messages at %.0f/s", name, parts, n, rate)
		}
	}
	return nil
}

// produceBacklog publishes n backlog messages (fresh event ids) to topic
// with kafka.Publisher, 1,000 per Publish.
func (b *bench) produceBacklog(ctx context.Context, topic string, n int) error {
	kp, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.brokers}, nil)
	if err != nil {
		return err
	}
	defer kp.Close()
	for from := 0; from < n; from += writeBatch {
		if err := ctx.Err(); err != nil {
			return err
		}
		msgs := make([]*message.Message, 0, writeBatch)
		for i := from; i < min(from+writeBatch, n); i++ {
			msgs = append(msgs, messageOf(uuid.Must(uuid.NewV7()).String(), i))
		}
		if err := kp.Publish(topic, msgs...); err != nil {
			return fmt.Errorf("produce the consumer backlog: %w", err)
		}
	}
	_, err = b.checkDelivered(topic, n)
	return err
}

// consume reads the n messages of topic in a fresh consumer group and
// schema, and returns messages per second from the first delivery until
// the n-th message's transaction committed (the group join is not timed).
func (b *bench) consume(ctx context.Context, topic string, n int, batched bool) (float64, error) {
	pool, schema, done, err := b.workspace(ctx, consumerWorkers+2)
	if err != nil {
		return 0, err
	}
	defer done()
	effect := sqlident.Table(schema, "bench_effect")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+effect+` (id uuid PRIMARY KEY, name text NOT NULL, data jsonb NOT NULL)`); err != nil {
		return 0, err
	}
	insert := `INSERT INTO ` + effect + ` (id, name, data) VALUES ($1, $2, $3)`
	dedup, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: "bench"})
	if err != nil {
		return 0, err
	}
	group := pgtest.RandomName("bench_group")

	var (
		first     atomic.Int64 // UnixNano of the first delivery
		processed atomic.Int64
	)
	delivered := func() { first.CompareAndSwap(0, time.Now().UnixNano()) }
	cctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	var wg sync.WaitGroup
	var closeSub func() error
	if batched {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: b.brokers, ConsumerGroup: group}, nil)
		if err != nil {
			return 0, err
		}
		closeSub = sub.Close
		batches, err := sub.SubscribeBatch(cctx, topic)
		if err != nil {
			sub.Close()
			return 0, err
		}
		handle := func(bt *core.Batch) error {
			delivered()
			return pgx.BeginFunc(cctx, pool, func(tx pgx.Tx) error {
				fresh, err := dedup.MarkTx(cctx, tx, bt.Messages...)
				if err != nil {
					return err
				}
				var q pgx.Batch
				for i, msg := range bt.Messages {
					if fresh[i] {
						q.Queue(insert, msg.UUID, msg.Metadata.Get(core.MetadataPartitionKey), msg.Payload)
					}
				}
				return tx.SendBatch(cctx, &q).Close()
			})
		}
		for range consumerWorkers {
			wg.Go(func() {
				for bt := range batches {
					if err := handle(bt); err != nil {
						bt.Nack()
						stop(err)
						continue
					}
					bt.Ack()
					processed.Add(int64(len(bt.Messages)))
				}
			})
		}
	} else {
		sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
			Brokers:               b.brokers,
			Unmarshaler:           wkafka.DefaultMarshaler{},
			OverwriteSaramaConfig: kafkatest.SaramaSubscriberConfig(),
			ConsumerGroup:         group,
		}, nil)
		if err != nil {
			return 0, err
		}
		closeSub = sub.Close
		msgs, err := sub.Subscribe(cctx, topic)
		if err != nil {
			sub.Close()
			return 0, err
		}
		h := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			tx, ok := core.TxFromContext(msg.Context())
			if !ok {
				return nil, errors.New("no transaction in the message context")
			}
			_, err := tx.Exec(msg.Context(), insert, msg.UUID, msg.Metadata.Get(core.MetadataPartitionKey), msg.Payload)
			return nil, err
		})
		for range consumerWorkers {
			wg.Go(func() {
				for msg := range msgs {
					delivered()
					if _, err := h(msg); err != nil {
						msg.Nack()
						stop(err)
						continue
					}
					msg.Ack()
					processed.Add(1)
				}
			})
		}
	}
	waitErr := waitFor(cctx, 10*time.Minute, func() bool { return processed.Load() >= int64(n) })
	finished := time.Now()
	stop(nil)
	closeErr := closeSub()
	wg.Wait()
	if err := context.Cause(cctx); err != nil && !errors.Is(err, context.Canceled) {
		return 0, err
	}
	if waitErr != nil {
		return 0, fmt.Errorf("%d of %d messages processed: %w", processed.Load(), n, waitErr)
	}
	if closeErr != nil && !strings.Contains(closeErr.Error(), "closed") {
		b.progress("consumer: close the subscriber: %v", closeErr)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+effect).Scan(&rows); err != nil {
		return 0, err
	}
	if rows != n {
		return 0, fmt.Errorf("the handler inserted %d rows for %d messages", rows, n)
	}
	return float64(n) / finished.Sub(time.Unix(0, first.Load())).Seconds(), nil
}
