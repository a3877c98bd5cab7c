package inbox

import (
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/tracing"
)

// traceDedup starts the span of one message's dedup handler, a consumer
// span continuing the trace in the message's metadata (the writer's
// traceparent), and puts it in the message's context so the handler's
// spans and the events it writes join the trace. The returned function
// ends the span and restores the message's context. Off, it does nothing.
func traceDedup(msg *message.Message, consumer string, eventID uuid.UUID) func(err *error) {
	if !tracing.On() {
		return noEnd
	}
	orig := msg.Context()
	ctx, span := tracing.Start(orig, "millrace.inbox.handle", trace.SpanKindConsumer, msg.Metadata,
		attribute.String("millrace.consumer", consumer), attribute.String("millrace.event_id", eventID.String()),
		attribute.String("millrace.partition_key", msg.Metadata.Get(core.MetadataPartitionKey)))
	msg.SetContext(ctx)
	return func(err *error) {
		msg.SetContext(orig)
		span.End(*err)
	}
}

func noEnd(*error) {}
