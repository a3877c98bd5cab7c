package millrace

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/internal/tracing"
)

// EnableTracing turns on OpenTelemetry tracing for every millrace component
// in the process, with tp (nil: the global provider, otel.GetTracerProvider,
// as it is at this call).
//
// On, the outbox Writer puts the W3C trace context of the caller's context
// (traceparent, tracestate) in each event's metadata, so it travels with
// the event through the relay and the broker; the inbox's dedup middleware
// (and Processor), the saga orchestrator and the compensation participants
// continue the trace from it, and the spans they write are children of the
// writer's: one trace shows an order placed, the saga's command, the
// participant, its reply and the next command. Spans: the relay's publish
// of each batch (a root span linked to the traces of its events), the
// dedup handler of each message, each saga transition (start, reply,
// timer, operator action) and each participant call.
//
// Tracing is off by default, and off costs nothing measurable: each hook
// is one atomic load, and no metadata is added.
func EnableTracing(tp trace.TracerProvider) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracing.Enable(tp)
}

// DisableTracing turns tracing off again.
func DisableTracing() { tracing.Disable() }
