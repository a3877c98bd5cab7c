package saga

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/internal/tracing"
)

// startTransition starts the span of one saga transition (start, reply,
// timer, operator), when tracing is on: under ctx's span, else under the
// trace context in md (a reply's metadata: the participant's span). The
// commands the transition writes carry its context (traceCommand). Off, it
// returns ctx and a nil span, whose End does nothing.
func startTransition(ctx context.Context, kind, sagaID, step string, md map[string]string) (context.Context, *tracing.Span) {
	if !tracing.On() {
		return ctx, nil
	}
	return tracing.Start(ctx, "millrace.saga."+kind, trace.SpanKindInternal, md,
		attribute.String("millrace.saga_id", sagaID), attribute.String("millrace.saga.step", step))
}

// traceCommand puts the trace context of the machine's transition in a
// command's metadata, so that a batch of transitions written in one call
// keeps each command in its own trace. Off, it does nothing.
func traceCommand(ctx context.Context, md map[string]string) {
	if tracing.On() {
		tracing.Inject(ctx, md)
	}
}
