package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// benchPayload is the payload of make bench's write figure: a small order.
var benchPayload = []byte(`{"order_id":"0190f1f0-0000-7000-8000-000000000001","amount":1234,"currency":"EUR","note":"bench"}`)

// BenchmarkWriteTx measures WriteTx in the caller's transaction: one event
// per transaction from 8 goroutines (the common case, what make bench's
// write_ratio measures), and 100 events in one call.
func BenchmarkWriteTx(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			db := pgtest.NewWith(b, pgtest.Options{MaxConns: 8})
			w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.SetParallelism(4) // 4 x GOMAXPROCS(2) = 8 writers
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				events := make([]outbox.Event, n)
				for pb.Next() {
					for i := range events {
						events[i] = outbox.Event{Topic: "orders", PartitionKey: "customer-42", EventType: "OrderPlaced",
							AggregateType: "Order", AggregateID: "o-1", Payload: benchPayload,
							Metadata: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
					}
					if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						_, err := w.WriteTx(ctx, tx, events...)
						return err
					}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
