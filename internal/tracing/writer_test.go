package tracing_test

import (
	"context"
	"fmt"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// TestWriterHeaders: off, the writer stores no trace context even under a
// caller's span; on, it stores the caller's span's traceparent, keeps a
// traceparent the event brings, and leaves the caller's metadata map as it
// was.
func TestWriterHeaders(t *testing.T) {
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "caller")
	defer span.End()
	stored := func(id string) map[string]string {
		t.Helper()
		var md map[string]string
		err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT headers FROM %s WHERE event_id = $1`,
			sqlident.Table(db.Schema, "outbox_event")), id).Scan(&md)
		if err != nil {
			t.Fatal(err)
		}
		return md
	}
	write := func(md map[string]string) string {
		t.Helper()
		ids, err := w.Write(ctx, outbox.Event{Topic: "orders", PartitionKey: "k", Payload: []byte(`{}`), Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}

	millrace.DisableTracing()
	if md := stored(write(map[string]string{"a": "1"})); md["traceparent"] != "" || md["a"] != "1" {
		t.Errorf("tracing off: stored %v", md)
	}
	millrace.EnableTracing(tp)
	defer millrace.DisableTracing()
	mine := map[string]string{"a": "1"}
	md := stored(write(mine))
	want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
	if md["traceparent"] != want || md["a"] != "1" {
		t.Errorf("tracing on: stored %v, want traceparent %s", md, want)
	}
	if len(mine) != 1 {
		t.Errorf("the writer changed the caller's metadata: %v", mine)
	}
	own := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if md := stored(write(map[string]string{"traceparent": own})); md["traceparent"] != own {
		t.Errorf("an event's own traceparent was replaced: %v", md)
	}
}
