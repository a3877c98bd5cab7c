package main

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"

	"github.com/millrace/millrace/internal/kafkatest"
)

// benchRaw measures raw_produce_events_per_s, the ceiling: the same n
// records (key, value, headers as the relay sends them, in the same record
// format: watermill-kafka's partitioning marshaler keyed by the partition
// key) produced straight to the broker by a sarama SyncProducer with
// kafkatest.SaramaConfig(), SendMessages in batches of produceSize.
// Building and marshaling each batch is timed, as it is in the relay.
func (b *bench) benchRaw(ctx context.Context) error {
	n := b.opts.n
	topic := newTopic("raw")
	producer, err := sarama.NewSyncProducer(b.brokers, kafkatest.SaramaConfig())
	if err != nil {
		return err
	}
	defer producer.Close()
	marshaler := kafkatest.WatermillMarshaler()
	batch := make([]*sarama.ProducerMessage, 0, produceSize)

	b.progress("raw: producing %d records in batches of %d", n, produceSize)
	started := time.Now()
	for from := 0; from < n; from += produceSize {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch = batch[:0]
		for i := from; i < min(from+produceSize, n); i++ {
			pm, err := marshaler.Marshal(topic, messageOf(uuid.Must(uuid.NewV7()).String(), i))
			if err != nil {
				return err
			}
			batch = append(batch, pm)
		}
		if err := producer.SendMessages(batch); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
	}
	elapsed := time.Since(started)
	if _, err := b.checkDelivered(topic, n); err != nil {
		return err
	}
	rate := float64(n) / elapsed.Seconds()
	b.results["raw_produce_events_per_s"] = round(rate, 0)
	b.progress("raw: %d records in %s = %.0f/s", n, elapsed.Round(time.Millisecond), rate)
	return nil
}
