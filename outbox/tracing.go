package outbox

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/internal/tracing"
)

// withTrace returns events with the W3C trace context of ctx in their
// metadata (traceparent, tracestate), when tracing is on
// (millrace.EnableTracing) and ctx carries a span. An event whose metadata
// has a traceparent keeps it. The caller's events and maps are not
// changed. Off, it returns events as they are.
func withTrace(ctx context.Context, events []Event) []Event {
	if !tracing.On() || !trace.SpanContextFromContext(ctx).IsValid() {
		return events
	}
	out := make([]Event, len(events))
	copy(out, events)
	for i := range out {
		if _, ok := out[i].Metadata[tracing.TraceParent]; ok {
			continue
		}
		md := make(map[string]string, len(out[i].Metadata)+2)
		maps.Copy(md, out[i].Metadata)
		tracing.Inject(ctx, md)
		out[i].Metadata = md
	}
	return out
}

// traceBatch starts the span of a relay batch's publish: a root span
// linked to the trace of each event that carries one. The returned
// function ends it. Off, it does nothing.
func traceBatch(ctx context.Context, rows []pendingRow) func(failed int, outage error) {
	if !tracing.On() {
		return func(int, error) {}
	}
	var links []trace.Link
	for i := range rows {
		md := rows[i].metadata()
		if md == nil {
			continue
		}
		if sc := tracing.SpanContext(md); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("millrace.event_id", rows[i].eventID)}})
		}
	}
	_, span := tracing.StartLinked(ctx, "millrace.outbox.publish_batch", trace.SpanKindProducer, links,
		attribute.Int("millrace.batch.size", len(rows)), attribute.String("messaging.destination.name", rows[0].topic))
	return func(failed int, outage error) {
		span.SetAttributes(attribute.Int("millrace.batch.failed", failed))
		span.End(outage)
	}
}
