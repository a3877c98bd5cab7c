package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/millrace/millrace/outbox"
)

// BenchmarkRelayDrain measures draining a backlog of b.N events to the
// broker with one relay; make bench measures the same at 200,000 events
// against a broker in another process, beside its baselines.
func BenchmarkRelayDrain(b *testing.B) {
	k := kafkaSetup(b)
	db, w, topic := k.db, k.w, k.topic
	ctx := context.Background()
	events := make([]outbox.Event, 0, 1000)
	for i := 0; i < b.N; i++ {
		events = append(events, outbox.Event{Topic: topic, PartitionKey: "key-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)), Payload: []byte(`{"order_id":"0190f1f0-0000-7000-8000-000000000001","amount":1234,"currency":"EUR","note":"bench"}`)})
		if len(events) == cap(events) || i == b.N-1 {
			if _, err := w.Write(ctx, events...); err != nil {
				b.Fatal(err)
			}
			events = events[:0]
		}
	}
	pub := newKafkaPublisherB(b, k.brokers)
	r, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: pub})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(rctx) }() //nolint:errcheck
	for {
		var n int
		if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+db.Schema+`".outbox_pending`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
}
