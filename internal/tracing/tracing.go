// Package tracing is millrace's OpenTelemetry switch and its W3C trace
// context carrier. Tracing is off until millrace.EnableTracing turns it on;
// off, every hook is one atomic load and returns at once (no allocation,
// no header written).
package tracing

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The metadata keys of the W3C trace context (https://www.w3.org/TR/trace-context/).
const (
	TraceParent = "traceparent"
	TraceState  = "tracestate"
)

// ScopeName is the instrumentation scope of millrace's spans.
const ScopeName = "github.com/millrace/millrace"

type holder struct{ tracer trace.Tracer }

var current atomic.Pointer[holder]

var propagator = propagation.TraceContext{}

// Enable turns tracing on with tp.
func Enable(tp trace.TracerProvider) {
	current.Store(&holder{tracer: tp.Tracer(ScopeName)})
}

// Disable turns tracing off.
func Disable() { current.Store(nil) }

// Tracer returns the tracer, or nil when tracing is off.
func Tracer() trace.Tracer {
	if h := current.Load(); h != nil {
		return h.tracer
	}
	return nil
}

// On reports whether tracing is on.
func On() bool { return current.Load() != nil }

// Inject writes ctx's span context into md as traceparent (and
// tracestate), unless tracing is off, ctx carries no valid span context, or
// md has a traceparent already (the event's writer chose one). md must not
// be nil.
func Inject(ctx context.Context, md map[string]string) {
	if _, ok := md[TraceParent]; ok {
		return
	}
	propagator.Inject(ctx, propagation.MapCarrier(md))
}

// Extract returns ctx with the remote span context in md, if it has a
// valid one.
func Extract(ctx context.Context, md map[string]string) context.Context {
	if md[TraceParent] == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(md))
}

// SpanContext returns the span context in md; it is invalid when md has
// none.
func SpanContext(md map[string]string) trace.SpanContext {
	return trace.SpanContextFromContext(Extract(context.Background(), md))
}

// Span is a started span, or nil when tracing is off. Its methods do
// nothing on nil.
type Span struct{ s trace.Span }

// Start starts a span under ctx's span, or under the remote span context
// in md when ctx has no valid one (md may be nil). It returns ctx unchanged
// and a nil *Span when tracing is off.
func Start(ctx context.Context, name string, kind trace.SpanKind, md map[string]string, attrs ...attribute.KeyValue) (context.Context, *Span) {
	t := Tracer()
	if t == nil {
		return ctx, nil
	}
	if !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = Extract(ctx, md)
	}
	ctx, s := t.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return ctx, &Span{s}
}

// StartLinked starts a root span linked to the given span contexts (the
// relay's batch, linked to the traces of the events it publishes).
func StartLinked(ctx context.Context, name string, kind trace.SpanKind, links []trace.Link, attrs ...attribute.KeyValue) (context.Context, *Span) {
	t := Tracer()
	if t == nil {
		return ctx, nil
	}
	ctx, s := t.Start(ctx, name, trace.WithSpanKind(kind), trace.WithNewRoot(), trace.WithLinks(links...), trace.WithAttributes(attrs...))
	return ctx, &Span{s}
}

// SetAttributes adds attributes.
func (s *Span) SetAttributes(attrs ...attribute.KeyValue) {
	if s != nil {
		s.s.SetAttributes(attrs...)
	}
}

// End ends the span, recording err as its status when not nil.
func (s *Span) End(err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}
