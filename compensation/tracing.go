package compensation

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/internal/tracing"
	"github.com/millrace/millrace/outbox"
)

// traceCall starts the span of one command at a participant, when tracing
// is on: under ctx's span (the inbox dedup handler's), else under the
// trace context in the command's metadata (the orchestrator's transition).
// The reply written in ctx carries it. Off, it returns ctx and a nil span.
func traceCall(ctx context.Context, participant string, msg *message.Message, call Call) (context.Context, *tracing.Span) {
	if !tracing.On() {
		return ctx, nil
	}
	return tracing.Start(ctx, "millrace.compensation."+call.Operation, trace.SpanKindServer, msg.Metadata,
		attribute.String("millrace.participant", participant), attribute.String("millrace.saga_id", call.SagaID),
		attribute.String("millrace.saga.step", call.Step), attribute.String("millrace.saga.command", call.Command),
		attribute.Int("millrace.saga.attempt", call.Attempt))
}

// traceBatchReply records, when tracing is on, a span for one command of
// a batch (HandleTx) under the command's trace context, and puts that
// span's context in the command's reply event, so that the orchestrator
// continues the trace. Off, it does nothing.
func traceBatchReply(p *Participant, it *item, reply *outbox.Event) {
	if !tracing.On() {
		return
	}
	ctx, span := traceCall(context.Background(), p.name, it.msg, it.call)
	tracing.Inject(ctx, reply.Metadata)
	span.End(nil)
}
