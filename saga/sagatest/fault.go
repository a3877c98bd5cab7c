package sagatest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/millrace/millrace/internal/sagahook"
)

// EventKind says what the harness is about to do.
type EventKind string

const (
	// Command: deliver a saga command to a participant.
	Command EventKind = "command"
	// Reply: deliver a participant's reply to the orchestrator.
	Reply EventKind = "reply"
	// Timer: fire a saga's due timer (a step timeout, a backoff retry, the
	// deadline).
	Timer EventKind = "timer"
	// Message: deliver any other message (an event the user's code wrote
	// to the outbox).
	Message EventKind = "message"
	// Signal: deliver an event to a saga (a message with the "saga_event"
	// header, see SendEvent and AddEvents). Its Event.Step is the event's
	// name.
	Signal EventKind = "signal"
)

// Event is one thing the harness does: a delivery or a timer. A Fault
// names the event it applies to with an Event whose zero fields match
// anything: Event{Kind: Reply, Step: "stock"} is every reply of step
// stock; add Seq: 1 for the first one only.
type Event struct {
	Kind EventKind
	// Saga is the saga id.
	Saga string
	// Step, Op (core.OperationAction or OperationCompensation) and
	// Attempt of the command or reply; empty for a timer.
	Step    string
	Op      string
	Attempt int
	// Outcome of a reply.
	Outcome string
	// Consumer is the subscriber the message is delivered to (the
	// participant's name, or "orchestrator").
	Consumer string
	// Topic is the message's topic.
	Topic string
	// Seq counts the times the harness met this event (same kind, saga,
	// step, operation, attempt and consumer): 2 for a duplicate, a
	// redelivery after a crash, or a timer's second firing for the saga.
	Seq int
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Kind, e.Saga)
	if e.Step != "" {
		fmt.Fprintf(&b, " %s/%s#%d", e.Step, e.Op, e.Attempt)
	}
	if e.Outcome != "" {
		fmt.Fprintf(&b, " %s", e.Outcome)
	}
	if e.Consumer != "" && e.Kind != Timer {
		fmt.Fprintf(&b, " →%s", e.Consumer)
	}
	if e.Seq > 1 {
		fmt.Fprintf(&b, " (seen %d)", e.Seq)
	}
	return b.String()
}

// key identifies an event up to Seq and Outcome.
func (e Event) key() string {
	return strings.Join([]string{string(e.Kind), e.Saga, e.Step, e.Op, fmt.Sprint(e.Attempt), e.Consumer}, "\x00")
}

// matches reports whether ev is one of the events e names: every non-zero
// field of e equals ev's.
func (e Event) matches(ev Event) bool {
	return (e.Kind == "" || e.Kind == ev.Kind) && (e.Saga == "" || e.Saga == ev.Saga) &&
		(e.Step == "" || e.Step == ev.Step) && (e.Op == "" || e.Op == ev.Op) &&
		(e.Attempt == 0 || e.Attempt == ev.Attempt) && (e.Outcome == "" || e.Outcome == ev.Outcome) &&
		(e.Consumer == "" || e.Consumer == ev.Consumer) && (e.Topic == "" || e.Topic == ev.Topic) &&
		(e.Seq == 0 || e.Seq == ev.Seq)
}

// FaultKind is a kind of fault the harness injects.
type FaultKind string

const (
	// Duplicate delivers the message now and again later (a redelivery:
	// same message id), behind the messages queued meanwhile.
	Duplicate FaultKind = "duplicate"
	// Drop loses the message: the step's timeout must recover.
	Drop FaultKind = "drop"
	// Delay holds the message back until Fault.Times timer firings (past
	// its step's timeout), then delivers it.
	Delay FaultKind = "delay"
	// Reorder delivers the next queued message of another saga first.
	Reorder FaultKind = "reorder"
	// Error makes a participant's handler fail with a technical error
	// Fault.Times times in a row (its transaction rolls back, as if the
	// database went away after the function ran), then succeed.
	Error FaultKind = "error"
	// Crash crashes the orchestrator at Fault.Point while it handles a
	// reply or fires a timer, and starts a new one: before the commit the
	// transaction is lost, after it the message is redelivered.
	Crash FaultKind = "crash"
)

// AllFaults are every kind of fault.
var AllFaults = []FaultKind{Duplicate, Drop, Delay, Reorder, Error, Crash}

// applies reports the kinds of fault that make sense at an event of kind k.
func applies(k EventKind) []FaultKind {
	switch k {
	case Command:
		return []FaultKind{Duplicate, Drop, Delay, Reorder, Error, Pause}
	case Reply:
		return []FaultKind{Duplicate, Drop, Delay, Reorder, Crash, Pause}
	case Timer:
		return []FaultKind{Crash}
	case Signal:
		return []FaultKind{Duplicate, Delay, Reorder, Crash}
	}
	return []FaultKind{Duplicate, Reorder}
}

// Fault is one fault to inject at the first event At matches (see
// every non-zero field of At matches); each fault of a Script applies once.
type Fault struct {
	Kind FaultKind
	At   Event
	// Times is how many times an Error fault fails the handler, and how
	// many timer firings a Delay fault holds its message (a Pause fault its
	// saga) for. Defaults to 1.
	Times int
	// Point is where a Crash fault crashes the orchestrator:
	// CrashLoaded, CrashBeforeCommit or CrashAfterCommit (1, 2, 3).
	// Defaults to CrashBeforeCommit.
	Point sagahook.Point
}

// The points of the orchestrator's transaction where a Crash fault
// (CrashAt) crashes it.
const (
	// CrashLoaded: the saga row is read and locked in the transaction
	// (for a reply, the reply decoded); nothing is written yet.
	CrashLoaded = sagahook.Loaded
	// CrashBeforeCommit: the saga's new state, history and commands are
	// written in the transaction, which is about to commit.
	CrashBeforeCommit = sagahook.BeforeCommit
	// CrashAfterCommit: the transaction committed.
	CrashAfterCommit = sagahook.AfterCommit
)

// On returns a fault of kind k at the events at names.
func (k FaultKind) On(at Event) Fault { return Fault{Kind: k, At: at} }

// DelayFor returns a Delay fault that holds the message at for n timer
// firings.
func DelayFor(n int, at Event) Fault { return Fault{Kind: Delay, At: at, Times: n} }

// FailTimes returns an Error fault: the participant's handler fails n
// times at the events at names, then succeeds.
func FailTimes(n int, at Event) Fault { return Fault{Kind: Error, At: at, Times: n} }

// CrashAt returns a Crash fault at point (CrashLoaded, CrashBeforeCommit
// or CrashAfterCommit) for the events at names.
func CrashAt(point sagahook.Point, at Event) Fault { return Fault{Kind: Crash, At: at, Point: point} }

func (f Fault) String() string {
	s := fmt.Sprintf("%s at %s", f.Kind, f.At)
	switch f.Kind {
	case Error:
		s = fmt.Sprintf("error ×%d at %s", max(f.Times, 1), f.At)
	case Delay:
		if f.Times > 1 {
			s = fmt.Sprintf("delay (%d timers) at %s", f.Times, f.At)
		}
	case Crash:
		s = fmt.Sprintf("crash %s at %s", f.point(), f.At)
	}
	return s
}

func (f Fault) point() sagahook.Point {
	if f.Point == 0 {
		return sagahook.BeforeCommit
	}
	return f.Point
}

// Faults is a fault plan: Script or Random.
type Faults interface {
	newPlanner() planner
}

// planner decides, event by event, which fault to inject.
type planner interface {
	// fault returns the fault to inject at ev, among the kinds allowed.
	fault(ev Event, allowed []FaultKind) (Fault, bool)
}

// Script returns a plan that injects exactly faults, each once, at the
// first event it matches.
func Script(faults ...Fault) Faults { return script(slices.Clone(faults)) }

type script []Fault

func (s script) newPlanner() planner {
	return &scriptPlanner{faults: slices.Clone(s), spent: make([]bool, len(s))}
}

type scriptPlanner struct {
	faults []Fault
	spent  []bool
}

func (p *scriptPlanner) fault(ev Event, allowed []FaultKind) (Fault, bool) {
	for i, f := range p.faults {
		if !p.spent[i] && slices.Contains(allowed, f.Kind) && f.At.matches(ev) {
			p.spent[i] = true
			f.At = ev
			return f, true
		}
	}
	return Fault{}, false
}

// RandomOptions tune Random.
type RandomOptions struct {
	// Rate is the chance of a fault at each event. Defaults to 0.15.
	Rate float64
	// Kinds are the faults to draw from. Defaults to AllFaults.
	Kinds []FaultKind
	// MaxFaults caps the faults of one run. Defaults to 8.
	MaxFaults int
	// MaxTimes caps the Times of Error and Delay faults. Defaults to 3.
	MaxTimes int
}

func (o RandomOptions) withDefaults() RandomOptions {
	if o.Rate == 0 {
		o.Rate = 0.15
	}
	if len(o.Kinds) == 0 {
		o.Kinds = AllFaults
	}
	if o.MaxFaults == 0 {
		o.MaxFaults = 8
	}
	if o.MaxTimes == 0 {
		o.MaxTimes = 3
	}
	return o
}

// Random returns a plan that draws faults from seed: the same seed, on the
// same scenario, injects the same faults at the same events.
func Random(seed uint64, opts RandomOptions) Faults {
	return randomPlan{seed: seed, opts: opts.withDefaults()}
}

type randomPlan struct {
	seed uint64
	opts RandomOptions
}

func (r randomPlan) newPlanner() planner {
	return &randomPlanner{rng: rand.New(rand.NewPCG(r.seed, 0x5a6a)), opts: r.opts}
}

type randomPlanner struct {
	rng  *rand.Rand
	opts RandomOptions
	n    int
}

func (p *randomPlanner) fault(ev Event, allowed []FaultKind) (Fault, bool) {
	if p.n >= p.opts.MaxFaults || p.rng.Float64() >= p.opts.Rate {
		return Fault{}, false
	}
	var kinds []FaultKind
	for _, k := range p.opts.Kinds {
		if slices.Contains(allowed, k) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		return Fault{}, false
	}
	f := Fault{Kind: kinds[p.rng.IntN(len(kinds))], At: ev}
	switch f.Kind {
	case Error, Delay:
		f.Times = 1 + p.rng.IntN(p.opts.MaxTimes)
	case Crash:
		f.Point = sagahook.Point(1 + p.rng.IntN(3))
	}
	p.n++
	return f, true
}

// noFaults is the empty plan.
type noFaults struct{}

func (noFaults) newPlanner() planner { return noFaults{} }

func (noFaults) fault(Event, []FaultKind) (Fault, bool) { return Fault{}, false }
