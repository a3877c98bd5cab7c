package tracing_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

type order struct {
	ID string `json:"id"`
}

// TestOneTraceAcrossTheBroker runs one saga of two remote steps through
// the outbox, a relay, the Kafka protocol and the inbox, with tracing on,
// and checks that its spans form one trace: the order service's span is
// the root, and the saga's start, each participant's handling (dedup
// handler and call), each reply's transition at the orchestrator and the
// next command descend from it in causal order. The relay's batch spans
// are roots of their own, linked to that trace.
func TestOneTraceAcrossTheBroker(t *testing.T) {
	t.Run("one by one", func(t *testing.T) { oneTrace(t, false) })
	// Batched: the orchestrator applies replies with RunBatched and the
	// participants run commands through a Batcher, many per transaction
	// and without the dedup middleware; each command and reply still
	// carries its own trace.
	t.Run("batched", func(t *testing.T) { oneTrace(t, true) })
}

func oneTrace(t *testing.T, batched bool) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	millrace.EnableTracing(tp)
	defer millrace.DisableTracing()
	defer func() { _ = tp.Shutdown(context.Background()) }()

	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 8})
	brokers := kafkatest.Brokers(t)
	creditTopic, shipTopic, replyTopic := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()

	def, err := saga.Define(saga.Spec[order]{
		Type: "order", Version: 1, ReplyTopic: replyTopic,
		Steps: []saga.Step[order]{
			{Name: "credit", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: creditTopic}, Compensation: &saga.Command[order]{}},
			{Name: "ship", Kind: saga.Pivot, Action: &saga.Command[order]{Topic: shipTopic}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Register(def); err != nil {
		t.Fatal(err)
	}
	participant := func(name, command string) *compensation.Participant {
		p, err := compensation.NewParticipant(db.Pool, compensation.Config{Schema: db.Schema, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		err = compensation.Register(p, command,
			func(context.Context, pgx.Tx, compensation.Call, order) (struct{}, error) { return struct{}{}, nil },
			func(context.Context, pgx.Tx, compensation.Call, order) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	payments, inventory := participant("payments", "credit"), participant("inventory", "ship")

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	retry := &middleware.Retry{MaxRetries: 50, InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond, ShouldRetry: inbox.ShouldRetry}
	if !batched {
		if _, err := o.AddToRouter(router, saga.RouterConfig{Subscriber: kafkatest.NewSubscriber(t, brokers), Poison: pub, Retry: retry}); err != nil {
			t.Fatal(err)
		}
	}
	parts := []struct {
		p     *compensation.Participant
		topic string
	}{{payments, creditTopic}, {inventory, shipTopic}}
	if !batched {
		for _, p := range parts {
			if _, err := p.p.AddToRouter(router, compensation.RouterConfig{Topic: p.topic, Subscriber: kafkatest.NewSubscriber(t, brokers), Poison: pub, Retry: retry}); err != nil {
				t.Fatal(err)
			}
		}
	}
	relay, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if batched {
		sub := kafkatest.NewSubscriber(t, brokers)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := o.RunBatched(ctx, saga.BatchConfig{Subscriber: sub, Poison: pub}); err != nil {
				t.Error(err)
			}
		}()
		for _, p := range parts {
			sub := kafkatest.NewSubscriber(t, brokers)
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.p.RunBatched(ctx, compensation.RunConfig{Subscriber: sub, Topic: p.topic, Poison: pub}); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	wg.Add(3)
	go func() { defer wg.Done(); _ = router.Run(ctx) }()
	go func() {
		defer wg.Done()
		if err := relay.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	go func() { defer wg.Done(); _ = o.Run(ctx) }()
	defer func() { cancel(); _ = router.Close(); wg.Wait() }()
	<-router.Running()

	// The order service places an order, in a span of its own, and starts
	// the saga in the order's transaction.
	octx, orderSpan := tp.Tracer("order-service").Start(context.Background(), "place order")
	err = pgx.BeginFunc(octx, db.Pool, func(tx pgx.Tx) error {
		_, err := saga.StartTx(octx, tx, o, def, "order-1", order{ID: "order-1"})
		return err
	})
	orderSpan.End()
	if err != nil {
		t.Fatal(err)
	}
	traceID := orderSpan.SpanContext().TraceID()

	deadline := time.Now().Add(time.Minute)
	for {
		in, err := o.Get(context.Background(), "order-1")
		if err != nil {
			t.Fatal(err)
		}
		if in.Status == saga.StatusCompleted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("saga not completed after a minute: %s at %s", in.Status, in.Step)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The saga and the participants record their dedup marks themselves
	// (a Router's message is a batch of one): no inbox handler spans.
	const handles = 0
	// A dedup handler's span ends after its commit, which may be after
	// the next hop's spans, and a relay batch's span after its mark, which
	// may be after the consumer applied the batch: wait for them all.
	var spans tracetest.SpanStubs
	for {
		spans = exp.GetSpans()
		if countNamed(spans, traceID, "millrace.saga.reply") >= 2 && countNamed(spans, traceID, "millrace.inbox.handle") >= handles &&
			relayLinks(spans, traceID) >= 4 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	byID := map[trace.SpanID]tracetest.SpanStub{}
	var inTrace []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == traceID {
			byID[s.SpanContext.SpanID()] = s
			inTrace = append(inTrace, s)
		}
	}
	// path returns the names from s up to the root of the trace.
	path := func(s tracetest.SpanStub) []string {
		var names []string
		for {
			names = append(names, s.Name)
			p, ok := byID[s.Parent.SpanID()]
			if !s.Parent.IsValid() || !ok {
				return names
			}
			s = p
		}
	}
	for _, s := range inTrace {
		if p := path(s); p[len(p)-1] != "place order" {
			t.Errorf("span %s is cut off from the order's span: path %v", s.Name, p)
		}
	}
	for name, want := range map[string]int{
		"place order": 1, "millrace.saga.start": 1, "millrace.inbox.handle": handles,
		"millrace.compensation.action": 2, "millrace.saga.reply": 2,
	} {
		if got := countNamed(spans, traceID, name); got != want {
			t.Errorf("%d %s spans in the trace, want %d", got, name, want)
		}
	}
	// The deepest span is the second reply's transition: its path is the
	// whole chain, order service → orchestrator → participant → reply →
	// next command → participant → reply.
	want := []string{
		"millrace.saga.reply", "millrace.compensation.action", "millrace.saga.reply", "millrace.compensation.action",
		"millrace.saga.start", "place order",
	}
	longest := []string{}
	for _, s := range inTrace {
		if p := path(s); len(p) > len(longest) {
			longest = p
		}
	}
	if len(longest) != len(want) {
		t.Fatalf("longest path %v, want %v", longest, want)
	}
	for i := range want {
		if longest[i] != want[i] {
			t.Fatalf("longest path %v, want %v", longest, want)
		}
	}
	// Which participant handled which command, on the spans.
	participants := map[string]bool{}
	for _, s := range inTrace {
		for _, a := range s.Attributes {
			if a.Key == "millrace.participant" {
				participants[a.Value.AsString()] = true
			}
		}
	}
	if !participants["payments"] || !participants["inventory"] {
		t.Errorf("participants on the spans: %v", participants)
	}
	// The relay's batches are roots of their own, linked to the trace.
	for _, s := range spans {
		if s.Name == "millrace.outbox.publish_batch" && s.Parent.IsValid() {
			t.Errorf("a relay batch span has a parent: %v", s.Parent)
		}
	}
	if linked := relayLinks(spans, traceID); linked < 4 { // 2 commands and 2 replies
		t.Errorf("%d relay batch links to the saga's trace, want at least 4", linked)
	}
}

// relayLinks counts the links of the relay's batch spans to trace id.
func relayLinks(spans tracetest.SpanStubs, id trace.TraceID) int {
	n := 0
	for _, s := range spans {
		if s.Name != "millrace.outbox.publish_batch" {
			continue
		}
		for _, l := range s.Links {
			if l.SpanContext.TraceID() == id {
				n++
			}
		}
	}
	return n
}

func countNamed(spans tracetest.SpanStubs, id trace.TraceID, name string) int {
	n := 0
	for _, s := range spans {
		if s.SpanContext.TraceID() == id && s.Name == name {
			n++
		}
	}
	return n
}
