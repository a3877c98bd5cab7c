package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace/internal/tracing"
)

// TestOffCostsNothing: with tracing off, the hooks allocate nothing and
// write no header, even under a caller's span.
func TestOffCostsNothing(t *testing.T) {
	tracing.Disable()
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	md := map[string]string{"k": "v"}
	allocs := testing.AllocsPerRun(1000, func() {
		c, span := tracing.Start(ctx, "x", trace.SpanKindInternal, md)
		span.SetAttributes()
		span.End(nil)
		_ = c
		_ = tracing.On()
	})
	if allocs != 0 {
		t.Errorf("tracing off: %v allocations per hook", allocs)
	}
	if tracing.Tracer() != nil {
		t.Error("a tracer while off")
	}
	// Inject itself writes the context; the components call it only when
	// tracing is on (tracing.On), which the e2e test shows.
	tracing.Inject(ctx, md)
	if md[tracing.TraceParent] != "00-01000000000000000000000000000000-0200000000000000-01" {
		t.Errorf("Inject wrote %q", md[tracing.TraceParent])
	}
	before := md[tracing.TraceParent]
	other := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}}))
	tracing.Inject(other, md)
	if md[tracing.TraceParent] != before {
		t.Error("Inject replaced a traceparent the event had")
	}
}
