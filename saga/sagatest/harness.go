package sagatest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// Config configures a harness.
type Config struct {
	// Faults is the fault plan: Script or Random. Defaults to none.
	Faults Faults
	// Effects reports, for one saga, how many times each step's effect is
	// applied now, as the participants' own tables show it (an action adds
	// one, its compensation takes it back). Every reported step must be 0
	// or 1 and agree with the step's final state (see Check). Steps absent
	// from the map are not checked: report 0 for a step you track that has
	// no effect. Defaults to none (the compensation barrier is still
	// checked).
	Effects func(ctx context.Context, h *H, sagaID string) (map[string]int, error)
	// Check is an extra invariant, called for every saga after a Run.
	// Defaults to none.
	Check func(ctx context.Context, h *H, in *saga.Instance) error
	// Saga configures the orchestrator; the harness sets its Schema,
	// Writer and Clock, and its Hook (a Hook given here is called after
	// the harness's own). Defaults to the zero Config.
	Saga saga.Config
	// Start is where the Clock starts. Defaults to 2026-01-01 00:00 UTC.
	Start time.Time
	// MaxEvents bounds one Run: more events than this is reported as a
	// saga that never settles. Defaults to 10000.
	MaxEvents int
	// BatchReplies delivers the replies queued for the orchestrator
	// together, up to 64 in one Orchestrator.HandleReplies call (the
	// batched path of RunBatched), instead of one by one to its Handler.
	// Defaults to false.
	BatchReplies bool
	// MaxRetries is how many times in a row a handler may fail with a
	// technical error (injected Error faults aside) before the Run gives
	// up on it. Defaults to 20.
	MaxRetries int
}

// H is a harness: one PostgreSQL schema, the outbox relay, an in-process
// transport the harness delivers from, one message at a time, a Clock, and
// an orchestrator it crashes and restarts at will. Register definitions and
// participants, start sagas, then Run: it delivers every message, fires
// every timer (moving the Clock), injects the planned faults, and checks
// the invariants (see Check). An H is not safe for concurrent use.
type H struct {
	env   *env
	cfg   Config
	ctx   context.Context
	clock *Clock

	defs []saga.Registrable
	o    *saga.Orchestrator
	oh   message.NoPublishHandlerFunc // o's reply handler
	subs map[string][]*subscriber     // by topic

	plan     planner
	queue    []*entry
	delayed  []*entry
	seen     map[string]int
	fired    []Fault
	trace    []string
	poisoned []string
	restarts int
	events   int
	crash    *armed
	failNext int           // Error fault: failures left for the handler being called
	paused   []*pausedSaga // Pause faults (pause.go)
}

// subscriber is a handler on a topic: the orchestrator or a participant.
type subscriber struct {
	name   string
	orch   bool
	handle func(msg *message.Message) error
}

// entry is a message queued for one subscriber.
type entry struct {
	sub   *subscriber
	topic string
	msg   *message.Message
	hold  int // timer firings a delayed message still waits for
}

// armed is a crash waiting for its hook point.
type armed struct {
	point sagahook.Point
	saga  string
	fired bool
}

// errCrash is what the hook returns to crash the orchestrator.
var errCrash = errors.New("sagatest: orchestrator crashed (injected)")

// errInjected is an injected technical error of a participant.
var errInjected = errors.New("sagatest: technical error (injected)")

// New returns a harness on a fresh schema, which is dropped when the test
// ends. It fails the test if PostgreSQL cannot be reached.
func New(t testing.TB, cfg Config) *H {
	t.Helper()
	h, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Open is New outside a test (an Example): Close drops the schema.
func Open(ctx context.Context, cfg Config) (*H, error) {
	e, err := newEnv(ctx)
	if err != nil {
		return nil, err
	}
	h, err := newH(ctx, e, cfg)
	if err != nil {
		e.close()
		return nil, err
	}
	return h, nil
}

// Close stops the relay and drops the schema.
func (h *H) Close() { h.env.close() }

func newH(ctx context.Context, e *env, cfg Config) (*H, error) {
	if cfg.Faults == nil {
		cfg.Faults = noFaults{}
	}
	if cfg.Start.IsZero() {
		cfg.Start = defaultStart
	}
	if cfg.MaxEvents == 0 {
		cfg.MaxEvents = 10000
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = 20
	}
	h := &H{env: e, cfg: cfg, ctx: ctx, clock: newClock(cfg.Start), subs: map[string][]*subscriber{},
		plan: cfg.Faults.newPlanner(), seen: map[string]int{}}
	if err := h.restart(); err != nil {
		return nil, err
	}
	return h, nil
}

// Pool is the harness's database pool.
func (h *H) Pool() *pgxpool.Pool { return h.env.db.Pool }

// Schema is the harness's schema: millrace's tables are there; put the
// participants' tables there too (they are emptied between the runs of
// Explore).
func (h *H) Schema() string { return h.env.db.Schema }

// Table returns the quoted, schema-qualified name of a table in Schema.
func (h *H) Table(name string) string { return sqlident.Table(h.env.db.Schema, name) }

// Writer is an outbox writer on Schema for the participants' replies and
// the user's own events.
func (h *H) Writer() *outbox.Writer { return h.env.writer }

// Clock is the orchestrator's clock.
func (h *H) Clock() *Clock { return h.clock }

// Context is the context the harness runs handlers with.
func (h *H) Context() context.Context { return h.ctx }

// Orchestrator returns the current orchestrator. A Crash fault replaces
// it with a new one: call Orchestrator again after Run rather than keep it.
func (h *H) Orchestrator() *saga.Orchestrator { return h.o }

// Register registers definitions with the orchestrator (and every one that
// replaces it after a crash).
func (h *H) Register(defs ...saga.Registrable) error {
	if err := h.o.Register(defs...); err != nil {
		return err
	}
	h.defs = append(h.defs, defs...)
	return nil
}

// NewParticipant returns a compensation.Participant on the harness's
// schema and writer. Register its commands, then AddParticipant it.
func (h *H) NewParticipant(name string) (*compensation.Participant, error) {
	return compensation.NewParticipant(h.Pool(), compensation.Config{Schema: h.Schema(), Name: name, Writer: h.Writer()})
}

// AddParticipant subscribes p to its command topics: each command is
// handled by p.HandleTx in a transaction that holds its inbox dedup mark
// (consumer: p's name), as p's own consumers do; the transaction belongs
// to the harness, so an injected Error fails it after p's writes.
func (h *H) AddParticipant(p *compensation.Participant, topics ...string) error {
	dedup, err := inbox.NewDeduplicator(h.Pool(), inbox.DedupConfig{Schema: h.Schema(), Consumer: p.Name()})
	if err != nil {
		return err
	}
	handle := func(msg *message.Message) error {
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return outbox.ErrNoTx
		}
		return p.HandleTx(msg.Context(), tx, msg)
	}
	for _, topic := range topics {
		h.AddHandler(p.Name(), topic, dedup.Middleware, handle)
	}
	return nil
}

// AddHandler subscribes a handler to topic under the consumer name name
// (each consumer gets its own copy of every message, as a Kafka consumer
// group would). mw, if not nil, wraps fn: the inbox dedup middleware,
// which owns the transaction fn runs in. An injected Error runs fn and
// then fails inside mw, so fn's writes roll back.
func (h *H) AddHandler(name, topic string, mw message.HandlerMiddleware, fn message.NoPublishHandlerFunc) {
	inner := func(msg *message.Message) ([]*message.Message, error) {
		if err := fn(msg); err != nil {
			return nil, err
		}
		if h.failNext > 0 {
			h.failNext--
			return nil, errInjected
		}
		return nil, nil
	}
	handle := func(msg *message.Message) error { _, err := inner(msg); return err }
	if mw != nil {
		wrapped := mw(inner)
		handle = func(msg *message.Message) error { _, err := wrapped(msg); return err }
	}
	h.subs[topic] = append(h.subs[topic], &subscriber{name: name, handle: handle})
}

// hook is the orchestrator's Hook: it crashes where a Crash fault is armed.
func (h *H) hook(_ context.Context, p sagahook.Point, sagaID string) error {
	if c := h.crash; c != nil && !c.fired && c.point == p && (c.saga == "" || c.saga == sagaID) {
		c.fired = true
		return errCrash
	}
	return nil
}

// restart starts a new orchestrator, as a new process would.
func (h *H) restart() error {
	cfg := h.cfg.Saga
	cfg.Schema, cfg.Writer, cfg.Clock, cfg.Hook = h.env.db.Schema, h.env.writer, h.clock, h.hook
	if user := h.cfg.Saga.Hook; user != nil {
		cfg.Hook = func(ctx context.Context, p sagahook.Point, id string) error {
			if err := h.hook(ctx, p, id); err != nil {
				return err
			}
			return user(ctx, p, id)
		}
	}
	o, err := saga.New(h.Pool(), cfg)
	if err != nil {
		return err
	}
	if len(h.defs) > 0 {
		if err := o.Register(h.defs...); err != nil {
			return err
		}
		if _, err := o.ParkUnregistered(h.ctx); err != nil {
			return err
		}
	}
	h.o, h.oh = o, o.Handler()
	return nil
}

func (h *H) logf(format string, args ...any) {
	h.trace = append(h.trace, fmt.Sprintf("%4d ", h.events)+fmt.Sprintf(format, args...))
}

// Report is what a Run did.
type Report struct {
	// Faults are the faults injected, in order, each with the exact event
	// it hit: Script(Faults...) repeats the run.
	Faults []Fault
	// Trace is one line per event.
	Trace []string
	// Violations are the invariants that do not hold; empty when all is
	// well.
	Violations []string
	// Events counts deliveries and timer firings; Restarts the
	// orchestrators started after a crash.
	Events, Restarts int
	// Elapsed is the time the Clock moved.
	Elapsed time.Duration
	// Seed is the seed of a Random plan (0 for any other).
	Seed uint64
}

// Err returns the violations as one error, or nil.
func (r *Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	return errors.New("sagatest: " + strings.Join(r.Violations, "\n\t"))
}

func (r *Report) String() string {
	var b strings.Builder
	if r.Seed != 0 {
		fmt.Fprintf(&b, "seed %d: ", r.Seed)
	}
	fmt.Fprintf(&b, "%d events, %d restarts, clock +%s\n", r.Events, r.Restarts, r.Elapsed)
	if len(r.Faults) > 0 {
		b.WriteString("faults:\n")
		for _, f := range r.Faults {
			fmt.Fprintf(&b, "\t%s\n", f)
		}
	}
	if len(r.Violations) > 0 {
		b.WriteString("violations:\n")
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "\t%s\n", v)
		}
	}
	b.WriteString("trace:\n")
	for _, l := range r.Trace {
		fmt.Fprintf(&b, "\t%s\n", l)
	}
	return b.String()
}

// Run delivers every message and fires every timer, with the planned
// faults, until no saga can move, then checks the invariants (see Check).
// It fails t, printing the faults and the trace, if one does not hold.
func (h *H) Run(t testing.TB) *Report {
	t.Helper()
	r := h.RunE()
	if len(r.Violations) > 0 {
		t.Fatalf("sagatest: invariants violated\n%s", r)
	}
	return r
}

// RunE is Run for code without a testing.TB: the report lists the
// violations.
func (h *H) RunE() *Report {
	start := h.clock.Now()
	err := h.loop()
	r := &Report{Faults: slices.Clone(h.fired), Events: h.events, Restarts: h.restarts}
	if p, ok := h.cfg.Faults.(randomPlan); ok {
		r.Seed = p.seed
	}
	if err != nil {
		r.Violations = append(r.Violations, err.Error())
	} else {
		r.Violations = h.check()
	}
	r.Trace, r.Elapsed = slices.Clone(h.trace), h.clock.Now().Sub(start)
	return r
}

// loop runs until nothing can happen.
func (h *H) loop() error {
	if _, err := h.o.ParkUnregistered(h.ctx); err != nil {
		return err
	}
	for _, topic := range h.o.ReplyTopics() {
		if !slices.ContainsFunc(h.subs[topic], func(s *subscriber) bool { return s.orch }) {
			h.subs[topic] = append(h.subs[topic], &subscriber{name: "orchestrator", orch: true,
				handle: func(msg *message.Message) error { return h.oh(msg) }})
		}
	}
	for {
		if h.events >= h.cfg.MaxEvents {
			return fmt.Errorf("no end after %d events: sagas keep moving (see the trace)", h.events)
		}
		// What the last deliveries published is collected only once the
		// queue is empty, in one wave: the order of delivery never
		// depends on how fast the relay was.
		if len(h.queue) == 0 {
			if err := h.collect(); err != nil {
				return err
			}
		}
		if len(h.queue) > 0 {
			if err := h.step(); err != nil {
				return err
			}
			continue
		}
		next, err := h.nextWakeup()
		if err != nil {
			return err
		}
		if next == nil {
			if len(h.delayed) == 0 && len(h.paused) == 0 {
				return nil
			}
			h.release(true)
			if err := h.resumePaused(true); err != nil {
				return err
			}
			continue
		}
		h.clock.set(*next)
		if err := h.fireTimers(); err != nil {
			return err
		}
		// What the timers sent goes before the messages they overtook.
		if err := h.collect(); err != nil {
			return err
		}
		h.release(false)
		if err := h.resumePaused(false); err != nil {
			return err
		}
	}
}

// release queues the delayed messages that waited for enough timer
// firings (all of them if all is set: no timer is left to wait for).
func (h *H) release(all bool) {
	kept := h.delayed[:0]
	for _, e := range h.delayed {
		if e.hold--; e.hold > 0 && !all {
			kept = append(kept, e)
			continue
		}
		e.hold = 0
		h.logf("release delayed %s", h.describe(e))
		h.queue = append(h.queue, e)
	}
	h.delayed = kept
}

// collect moves what the relay published into the queue: one entry per
// subscriber, ordered by saga (partition key) then outbox id, so that the
// order does not depend on which saga a timer batch handled first.
func (h *H) collect() error {
	got, seq, err := h.env.drain(h.ctx)
	if err != nil || len(got) == 0 {
		return err
	}
	slices.SortStableFunc(got, func(a, b published) int {
		return cmp.Or(cmp.Compare(a.msg.Metadata.Get(core.MetadataPartitionKey), b.msg.Metadata.Get(core.MetadataPartitionKey)),
			cmp.Compare(seq[a.msg.UUID], seq[b.msg.UUID]))
	})
	for _, p := range got {
		subs := h.subs[p.topic]
		if len(subs) == 0 {
			continue // an event the user's code wrote for another service
		}
		for _, s := range subs {
			h.queue = append(h.queue, &entry{sub: s, topic: p.topic, msg: p.msg})
		}
	}
	return nil
}

// eventOf labels the delivery of e.
func (h *H) eventOf(e *entry) Event {
	md := e.msg.Metadata
	ev := Event{Kind: Message, Saga: md.Get(core.MetadataSagaID), Consumer: e.sub.name, Topic: e.topic}
	if op := md.Get(core.MetadataSagaOperation); op != "" {
		ev.Kind, ev.Step, ev.Op = Command, md.Get(core.MetadataSagaStep), op
		ev.Attempt, _ = strconv.Atoi(md.Get(core.MetadataSagaAttempt))
		if o := md.Get(core.MetadataSagaOutcome); o != "" {
			ev.Kind, ev.Outcome = Reply, o
		}
	}
	if name := md.Get(headerEvent); name != "" {
		ev.Kind, ev.Step = Signal, name // events.go
	}
	if ev.Saga == "" {
		ev.Saga = md.Get(core.MetadataPartitionKey)
	}
	return ev
}

func (h *H) describe(e *entry) string { return h.eventOf(e).String() }

// label names the delivery of e, its Seq counting this one.
func (h *H) label(e *entry) Event {
	ev := h.eventOf(e)
	ev.Seq = h.seen[ev.key()] + 1
	return ev
}

// step delivers the head of the queue, with its fault if one is planned.
func (h *H) step() error {
	e := h.queue[0]
	if h.cfg.BatchReplies && e.sub.orch {
		return h.stepBatch()
	}
	ev := h.label(e)
	h.events++
	f, faulty := h.plan.fault(ev, applies(ev.Kind))
	if faulty {
		h.fired = append(h.fired, f)
		switch f.Kind {
		case Drop:
			h.seen[ev.key()]++
			h.logf("DROP %s", ev)
			h.queue = h.queue[1:]
			return nil
		case Delay:
			e.hold = max(f.Times, 1)
			h.logf("DELAY %s for %d timer firings", ev, e.hold)
			h.queue = h.queue[1:]
			h.delayed = append(h.delayed, e)
			return nil
		case Reorder:
			for i := 1; i < len(h.queue); i++ {
				if o := h.queue[i]; o.msg.Metadata.Get(core.MetadataPartitionKey) != e.msg.Metadata.Get(core.MetadataPartitionKey) {
					// o jumps the queue: the messages of e's saga keep
					// their order.
					h.logf("REORDER %s: %s first", ev, h.describe(o))
					h.queue = slices.Insert(slices.Delete(h.queue, i, i+1), 0, o)
					return h.deliver(o, h.label(o), Fault{})
				}
			}
			h.logf("REORDER %s: nothing else queued", ev)
		case Duplicate:
			h.logf("DUPLICATE %s", ev)
			h.queue = append(h.queue, &entry{sub: e.sub, topic: e.topic, msg: e.msg})
		case Pause:
			if err := h.pause(ev.Saga, f); err != nil {
				return err
			}
		}
	}
	return h.deliver(e, ev, f)
}

// deliver hands e to its subscriber and removes it from the queue once
// acknowledged. f is its Error or Crash fault, if any.
func (h *H) deliver(e *entry, ev Event, f Fault) error {
	remove := func() {
		if i := slices.Index(h.queue, e); i >= 0 {
			h.queue = slices.Delete(h.queue, i, i+1)
		}
	}
	switch f.Kind {
	case Crash:
		h.crash = &armed{point: f.point(), saga: ev.Saga}
		h.logf("deliver %s, CRASH at %s", ev, f.point())
	case Error:
		h.failNext = max(f.Times, 1)
		h.logf("deliver %s, ERROR ×%d", ev, h.failNext)
	default:
		h.logf("deliver %s", ev)
	}
	h.seen[ev.key()]++
	defer func() { h.crash, h.failNext = nil, 0 }()
	for try := 1; ; try++ {
		msg := e.msg.Copy()
		msg.SetContext(h.ctx)
		err := e.sub.handle(msg)
		switch {
		case err == nil:
			remove()
			return nil
		case errors.Is(err, errCrash):
			// The process died: the message was not acknowledged and
			// comes again, to a new orchestrator.
			h.logf("  orchestrator crashed (%v); restarted, message redelivered", err)
			h.crash = nil
			h.restarts++
			if err := h.restart(); err != nil {
				return err
			}
			return nil
		case core.IsPermanent(err):
			h.logf("  POISONED: %v", err)
			h.poisoned = append(h.poisoned, fmt.Sprintf("%s: %v", ev, err))
			remove()
			return nil
		case errors.Is(err, errInjected):
			h.logf("  failed (injected), retried")
			continue
		case try >= h.cfg.MaxRetries:
			return fmt.Errorf("%s: handler failed %d times: %w", ev, try, err)
		}
		h.logf("  failed: %v; retried", err)
	}
}

// stepBatch delivers the replies at the head of the queue in one
// HandleReplies call, each with its fault if one is planned.
func (h *H) stepBatch() error {
	var batch []*entry
	h.crash = nil
	defer func() { h.crash = nil }()
	for len(h.queue) > 0 && len(batch) < 64 && h.queue[0].sub.orch {
		e := h.queue[0]
		ev := h.label(e)
		h.events++
		f, faulty := h.plan.fault(ev, applies(ev.Kind))
		if faulty && f.Kind == Crash && h.crash != nil {
			faulty = false // one crash per batch
		}
		if faulty {
			h.fired = append(h.fired, f)
			switch f.Kind {
			case Drop:
				h.seen[ev.key()]++
				h.logf("DROP %s", ev)
				h.queue = h.queue[1:]
				continue
			case Delay:
				e.hold = max(f.Times, 1)
				h.logf("DELAY %s for %d timer firings", ev, e.hold)
				h.queue = h.queue[1:]
				h.delayed = append(h.delayed, e)
				continue
			case Reorder:
				i := slices.IndexFunc(h.queue, func(o *entry) bool {
					return o.msg.Metadata.Get(core.MetadataPartitionKey) != e.msg.Metadata.Get(core.MetadataPartitionKey)
				})
				if i > 0 {
					h.logf("REORDER %s: %s first", ev, h.describe(h.queue[i]))
					o := h.queue[i]
					h.queue = slices.Insert(slices.Delete(h.queue, i, i+1), 0, o)
					continue
				}
				h.logf("REORDER %s: nothing else queued", ev)
			case Duplicate:
				h.logf("DUPLICATE %s", ev)
				h.queue = append(h.queue, &entry{sub: e.sub, topic: e.topic, msg: e.msg})
			case Crash:
				h.crash = &armed{point: f.point(), saga: ev.Saga}
				h.logf("batch %s, CRASH at %s", ev, f.point())
			case Pause:
				if err := h.pause(ev.Saga, f); err != nil {
					return err
				}
			}
		}
		if !faulty || f.Kind != Crash {
			h.logf("batch %s", ev)
		}
		h.seen[ev.key()]++
		h.queue = h.queue[1:]
		batch = append(batch, e)
	}
	if len(batch) == 0 {
		return nil
	}
	for try := 1; ; try++ {
		msgs := make([]*message.Message, len(batch))
		for i, e := range batch {
			msgs[i] = e.msg.Copy()
			msgs[i].SetContext(h.ctx)
		}
		res, err := h.o.HandleReplies(h.ctx, msgs)
		switch {
		case err == nil:
			for i, perr := range res.Poisoned {
				h.logf("  POISONED: %v", perr)
				h.poisoned = append(h.poisoned, fmt.Sprintf("%s: %v", h.describe(batch[i]), perr))
			}
			h.logf("  delivered %d replies in one transaction", len(batch))
			return nil
		case errors.Is(err, errCrash):
			h.logf("  orchestrator crashed (%v); restarted, %d replies redelivered", err, len(batch))
			h.crash = nil
			h.restarts++
			h.queue = append(batch, h.queue...)
			return h.restart()
		case try >= h.cfg.MaxRetries:
			return fmt.Errorf("a batch of %d replies failed %d times: %w", len(batch), try, err)
		}
		h.logf("  failed: %v; retried", err)
	}
}

// eventsDue is the condition on a saga s that a timer pass applies its new
// events now (as saga's claim of them does): a child saga's end told to
// its parent, or a parent's request to its child, waits for one.
func (h *H) eventsDue() string {
	return fmt.Sprintf(`(s.id IN (SELECT saga_id FROM %s WHERE state = 'new') AND s.status NOT IN ('paused', 'scheduled')
   AND (SELECT e.event FROM %s e WHERE e.saga_id = s.id AND e.event <> 'fenced' ORDER BY e.id DESC LIMIT 1) IS DISTINCT FROM 'timer_failed')`,
		h.Table("saga_event"), h.Table("saga_history"))
}

// nextWakeup returns the earliest timer of any saga: now, if a saga's
// new events are due (eventsDue).
func (h *H) nextWakeup() (*time.Time, error) {
	var next *time.Time
	err := h.Pool().QueryRow(h.ctx, fmt.Sprintf(`SELECT least(min(next_wakeup_at), (SELECT $1::timestamptz FROM %s s WHERE %s LIMIT 1)) FROM %s`,
		h.Table("saga_instance"), h.eventsDue(), h.Table("saga_instance")), h.clock.Now()).Scan(&next)
	if err != nil {
		return nil, fmt.Errorf("sagatest: next timer: %w", err)
	}
	return next, nil
}

// fireTimers fires every timer due at the clock's time, each due saga one
// Timer event (where a Crash fault may hit).
func (h *H) fireTimers() error {
	for range 1000 {
		rows, err := h.Pool().Query(h.ctx, fmt.Sprintf(`SELECT id FROM %s s WHERE next_wakeup_at <= $1 OR %s ORDER BY id`,
			h.Table("saga_instance"), h.eventsDue()), h.clock.Now())
		if err != nil {
			return fmt.Errorf("sagatest: due timers: %w", err)
		}
		due, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("sagatest: due timers: %w", err)
		}
		if len(due) == 0 {
			return nil
		}
		h.crash = nil
		for _, id := range due {
			ev := Event{Kind: Timer, Saga: id}
			h.seen[ev.key()]++
			ev.Seq = h.seen[ev.key()]
			h.events++
			// At most one crash per firing: which of two armed crashes
			// came first would depend on the order the batch is claimed in.
			if h.crash == nil {
				if f, ok := h.plan.fault(ev, applies(Timer)); ok {
					h.fired = append(h.fired, f)
					h.crash = &armed{point: f.point(), saga: id}
					h.logf("fire %s at +%s, CRASH at %s", ev, h.clock.Now().Sub(h.cfg.Start), f.point())
					continue
				}
			}
			h.logf("fire %s at +%s", ev, h.clock.Now().Sub(h.cfg.Start))
		}
		_, err = h.o.RunDue(h.ctx)
		h.crash = nil
		if errors.Is(err, errCrash) {
			h.logf("  orchestrator crashed (%v); restarted", err)
			h.restarts++
			if err := h.restart(); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("sagatest: timers: %w", err)
		}
	}
	return errors.New("sagatest: timers keep firing at one instant")
}

// Get returns a saga.
func (h *H) Get(id string) (*saga.Instance, error) { return h.o.Get(h.ctx, id) }

// History returns a saga's history.
func (h *H) History(id string) ([]saga.HistoryEntry, error) { return h.o.History(h.ctx, id) }
