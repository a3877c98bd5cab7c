package inbox_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

// The handler under benchmark writes one row. Both benchmarks run it from
// b.RunParallel goroutines (GOMAXPROCS of them, times 4 via SetParallelism)
// like a Router's concurrent handlers.

func BenchmarkHandlerWithoutDedup(b *testing.B) {
	bb := setup(b, 16)
	ctx := context.Background()
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			msg := message.NewMessage(uuid.NewString(), nil)
			// Without dedup the handler opens its own transaction.
			if err := pgx.BeginFunc(ctx, bb.db.Pool, func(tx pgx.Tx) error { return bb.apply(ctx, tx, msg.UUID, "") }); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkHandlerWithDedup(b *testing.B) {
	bb := setup(b, 16)
	d, err := inbox.NewDeduplicator(bb.db.Pool, inbox.DedupConfig{Schema: bb.db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		return nil, bb.apply(msg.Context(), tx, msg.UUID, "")
	})
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := h(message.NewMessage(uuid.NewString(), nil)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkReceive measures messages accepted per second by the
// store-then-process Receiver, in calls of 500 messages from 4 goroutines.
func BenchmarkReceive(b *testing.B) {
	bb := setup(b, 8)
	r, err := inbox.NewReceiver(bb.db.Pool, inbox.ReceiverConfig{Schema: bb.db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	const batch = 500
	ctx := context.Background()
	b.SetParallelism(2)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]*message.Message, 0, batch)
		flush := func() {
			if len(buf) == 0 {
				return
			}
			if _, err := r.Receive(ctx, buf...); err != nil {
				b.Error(err)
			}
			buf = buf[:0]
		}
		for pb.Next() {
			buf = append(buf, message.NewMessage(uuid.NewString(), []byte(`{"order_id":"o-1","amount":100}`)))
			if len(buf) == batch {
				flush()
			}
		}
		flush()
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
