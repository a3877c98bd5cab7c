package tracing_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/tracing"
	"github.com/millrace/millrace/outbox"
)

// tracingModes runs bench with tracing off and on (an SDK provider that
// samples every span, batching them to an exporter that drops them: the
// cost in this process, not the collector's).
func tracingModes(b *testing.B, bench func(b *testing.B, ctx context.Context)) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	// The caller's context has a span in both modes, as in a traced service.
	ctx, span := tp.Tracer("bench").Start(context.Background(), "caller")
	defer span.End()
	b.Run("off", func(b *testing.B) {
		millrace.DisableTracing()
		bench(b, ctx)
	})
	b.Run("on", func(b *testing.B) {
		millrace.EnableTracing(tp)
		defer millrace.DisableTracing()
		bench(b, ctx)
	})
}

// BenchmarkWrite is outbox.Writer.Write of one event per transaction, from
// 4 goroutines, with tracing off and on (on: the traceparent goes into the
// event's metadata).
func BenchmarkWrite(b *testing.B) {
	db := pgtest.NewWith(b, pgtest.Options{MaxConns: 8})
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	tracingModes(b, func(b *testing.B, ctx context.Context) {
		b.SetParallelism(4)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, err := w.Write(ctx, outbox.Event{Topic: "orders", PartitionKey: uuid.NewString(), EventType: "OrderPlaced",
					Payload: []byte(`{"n":1}`), Metadata: map[string]string{"source": "bench"}})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}

// BenchmarkDedupHandler is the inbox dedup middleware around a handler
// that writes one outbox event in the message's transaction (a participant
// replying), 4 callers, each message carrying a traceparent as the writer
// puts it; tracing off and on (on: a consumer span per message, restored
// from the metadata, and the reply's traceparent).
func BenchmarkDedupHandler(b *testing.B) {
	db := pgtest.NewWith(b, pgtest.Options{MaxConns: 8})
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	d, err := inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{Schema: db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		_, err := w.WriteTx(msg.Context(), tx, outbox.Event{Topic: "replies", PartitionKey: msg.UUID, EventType: "Reply", Payload: []byte(`{}`)})
		return nil, err
	})
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tracingModes(b, func(b *testing.B, _ context.Context) {
		b.SetParallelism(4)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				msg := message.NewMessage(uuid.NewString(), nil)
				msg.Metadata.Set("traceparent", traceparent)
				if _, err := h(msg); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}

// BenchmarkHooks is the CPU cost of what tracing adds to one message that
// a participant handles, without the database: the dedup handler's span
// restored from the metadata, the participant's span, and the reply's
// traceparent; off and on.
func BenchmarkHooks(b *testing.B) {
	md := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	tracingModes(b, func(b *testing.B, _ context.Context) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, s1 := tracing.Start(context.Background(), "millrace.inbox.handle", trace.SpanKindConsumer, md)
			ctx, s2 := tracing.Start(ctx, "millrace.compensation.action", trace.SpanKindServer, md)
			if tracing.On() {
				reply := make(map[string]string, 2)
				tracing.Inject(ctx, reply)
			}
			s2.End(nil)
			s1.End(nil)
		}
	})
}
