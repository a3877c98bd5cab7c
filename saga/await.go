package saga

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
)

// Await is a wait step's events: the step waits until one event (Event),
// the first of several (Any) or every one of a set (All) has been
// delivered to the saga with Signal, SignalTx or EventHandler. Set exactly
// one of Event, Any and All. An event delivered before the saga reaches the
// step is stored and consumed when it gets there, in order of arrival.
type Await[D any] struct {
	// Event is the one event the step waits for.
	Event string
	// Any lists events of which the first to arrive completes the step;
	// the others, when they come, are recorded in the history and
	// ignored. At least two names.
	Any []string
	// All lists events that must all arrive, in any order; each is
	// applied (OnEvent, On) as it arrives, and the step completes with
	// the last one. A second event of a name already applied is recorded
	// and ignored. A wait that has applied some of them has taken effect:
	// if the saga compensates before the last one (Abort, the wait's
	// TimeoutCompensate, the deadline, a later event's failure), the
	// step's LocalCompensation runs. At least two names.
	All []string

	// OnEvent applies an event's payload (JSON) to the data (see
	// EventFunc for a typed version). Defaults to leaving the data as is.
	// It returns Fail(reason) (or a core.Permanent error) for a
	// business failure: the event is consumed and the step fails (the
	// saga compensates before the pivot, and is stuck after it). Any other
	// error parks the saga as stuck with the event kept: an operator's
	// Retry applies it again.
	OnEvent func(data *D, payload json.RawMessage) error
	// On overrides OnEvent per event name (for Any and All: approved and
	// rejected, say). Each key must be one of the step's events.
	On map[string]func(data *D, payload json.RawMessage) error

	// Timeout bounds the wait from the moment the saga reaches the step.
	// Defaults to none: the saga's Deadline still applies.
	Timeout time.Duration
	// OnTimeout is what the Timeout does: TimeoutCompensate (the step
	// fails: the saga compensates; not after the pivot), TimeoutStuck (an
	// operator decides; their Retry waits again, with a new Timeout) or
	// TimeoutContinue (the saga goes on to the next step). Required with a
	// Timeout: a wait has nothing to retry, so TimeoutRetry is refused.
	OnTimeout TimeoutAction
}

// EventFunc adapts a typed event handler to Await.OnEvent (or an entry
// of Await.On): the payload is decoded from JSON into E first (a null or
// empty payload leaves E zero).
func EventFunc[D, E any](fn func(data *D, event E) error) func(*D, json.RawMessage) error {
	return func(d *D, raw json.RawMessage) error {
		var e E
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &e); err != nil {
				return fmt.Errorf("saga: decode event: %w", err)
			}
		}
		return fn(d, e)
	}
}

// StepWaiting is the StepState.Status of a wait step that waits for its
// events (StepState.Events lists the ones applied so far).
const StepWaiting = "waiting"

// checkAwait refuses what a wait step must not have (Define calls it).
func checkAwait[D any](s Step[D]) error {
	a := s.Await
	switch {
	case s.Action != nil || s.Local != nil:
		return errors.New("a wait step has no Action or Local")
	case s.OnSuccess != nil || s.Compensation != nil:
		return errors.New("a wait step has no OnSuccess or remote Compensation (use LocalCompensation to undo what its events did)")
	case s.Group != "":
		return errors.New("a wait step cannot be in a parallel group")
	case s.OnTimeout != TimeoutRetry:
		return errors.New("a wait step's timeout is Await.Timeout and Await.OnTimeout, not Step.OnTimeout")
	}
	var names []string
	set := 0
	if a.Event != "" {
		names, set = []string{a.Event}, set+1
	}
	if a.Any != nil {
		names, set = a.Any, set+1
		if len(a.Any) < 2 {
			return errors.New("Await.Any needs at least two events (use Event for one)")
		}
	}
	if a.All != nil {
		names, set = a.All, set+1
		if len(a.All) < 2 {
			return errors.New("Await.All needs at least two events (use Event for one)")
		}
	}
	if set != 1 {
		return errors.New("set exactly one of Await.Event, Await.Any and Await.All")
	}
	seen := map[string]bool{}
	for _, n := range names {
		if err := checkName(n); err != nil {
			return fmt.Errorf("event name %q: %v", n, err)
		}
		if seen[n] {
			return fmt.Errorf("event %q is listed twice", n)
		}
		seen[n] = true
	}
	for n := range a.On {
		if !seen[n] {
			return fmt.Errorf("Await.On has event %q, which the step does not wait for", n)
		}
	}
	if a.Timeout < 0 {
		return errors.New("negative Await.Timeout")
	}
	switch a.OnTimeout {
	case TimeoutRetry:
		if a.Timeout > 0 {
			return errors.New("Await.Timeout is set and Await.OnTimeout is TimeoutRetry (its zero value, as when it is not set): a wait has nothing to retry; set OnTimeout to TimeoutCompensate, TimeoutStuck or TimeoutContinue")
		}
	case TimeoutCompensate:
		if s.Kind == Retriable {
			return errors.New("Await.OnTimeout is TimeoutCompensate, but steps after the pivot never compensate")
		}
	case TimeoutStuck, TimeoutContinue:
	default:
		return fmt.Errorf("unknown Await.OnTimeout %d", a.OnTimeout)
	}
	return nil
}

// waitDef is a wait step with its data type erased.
type waitDef struct {
	names     []string
	all       bool
	on        map[string]func(data, payload []byte) ([]byte, error)
	timeout   time.Duration
	onTimeout TimeoutAction
}

func (w *waitDef) has(name string) bool { return slices.Contains(w.names, name) }

func eraseAwait[D any](a *Await[D]) *waitDef {
	w := &waitDef{timeout: a.Timeout, onTimeout: a.OnTimeout, on: map[string]func(data, payload []byte) ([]byte, error){}}
	switch {
	case a.Event != "":
		w.names = []string{a.Event}
	case a.Any != nil:
		w.names = slices.Clone(a.Any)
	default:
		w.names, w.all = slices.Clone(a.All), true
	}
	for _, n := range w.names {
		fn := a.OnEvent
		if f, ok := a.On[n]; ok {
			fn = f
		}
		if fn == nil {
			continue
		}
		w.on[n] = func(data, payload []byte) ([]byte, error) {
			return withData(data, func(d *D) error { return fn(d, payload) })
		}
	}
	return w
}

// waitsFor reports whether a step of d from index from on waits for event.
func (d *def) waitsFor(from int, event string) bool {
	for i := max(from, 0); i < len(d.steps); i++ {
		if w := d.steps[i].wait; w != nil && w.has(event) {
			return true
		}
	}
	return false
}

func (d *def) hasWaits() bool { return d.waitsFrom(0) }

func (d *def) waitsFrom(from int) bool {
	for _, s := range d.steps[max(from, 0):] {
		if s.wait != nil {
			return true
		}
	}
	return false
}

// States of a stored event (saga_event.state; see migration 009).
const (
	eventNew      = "new"
	eventPending  = "pending"
	eventConsumed = "consumed"
	eventIgnored  = "ignored"
	eventRefused  = "refused"
	// eventHeld is no state: the outcome of the history line of an event
	// stored (as new) for a paused or scheduled saga.
	eventHeld = "held"
)

// storedEvent is a row of saga_event.
type storedEvent struct {
	arrived  int64
	name, id string
	payload  []byte
	state    string
	at       time.Time // when it arrived
	// child is set on an event between a parent and its child saga: the
	// child's id (child.go).
	child string
}

func scanEvents(rows pgx.Rows) ([]storedEvent, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (storedEvent, error) {
		var e storedEvent
		err := row.Scan(&e.arrived, &e.name, &e.id, &e.payload, &e.state, &e.at, &e.child)
		return e, err
	})
}

// enterWait starts wait step s: it consumes the events stored for it, in
// order of arrival, and reports whether that completed it.
func (m *machine) enterWait(s *stepDef, st *StepState) (done bool, err error) {
	st.Status, st.Due, st.Reason = StepWaiting, nil, ""
	if s.wait.timeout > 0 {
		st.Due = m.due(s.wait.timeout)
	}
	m.record("waiting", s.name, "", 0, "", strings.Join(s.wait.names, ", "))
	rows, err := m.tx.Query(m.ctx, m.o.sql.events.open, m.in.ID, s.wait.names)
	if err != nil {
		return false, technicalError{fmt.Errorf("saga %s: read stored events: %w", m.in.ID, err)}
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return false, technicalError{fmt.Errorf("saga %s: read stored events: %w", m.in.ID, err)}
	}
	i := m.d.index[s.name]
	for _, ev := range evs {
		switch {
		case st.Status == StepWaiting && m.in.Status == StatusRunning && m.in.Step == s.name:
			err = m.applyEvent(s, st, ev)
		case st.Status == StepWaiting && m.in.Step == s.name && s.wait.needs(st, ev.name):
			// An event before it could not be applied: the saga is stuck
			// at this wait, which still needs this one (an operator's
			// Retry waits again and applies both).
			err = m.keepPending(ev, "the wait is stuck on an earlier event and still needs it")
		default:
			err = m.leftOver(ev, i+1)
		}
		if err != nil {
			return false, err
		}
	}
	return st.Status == StepDone && m.in.Status == StatusRunning && m.in.Step == s.name, nil
}

// applyEvent applies event ev to wait step s, which waits for it.
func (m *machine) applyEvent(s *stepDef, st *StepState, ev storedEvent) error {
	if s.wait.all && slices.Contains(st.Events, ev.name) {
		return m.eventOutcome(ev, eventIgnored, s.name, "the step has applied an event "+ev.name+" already")
	}
	m.applied = true
	data, ferr := m.in.Data, error(nil)
	if fn := s.wait.on[ev.name]; fn != nil {
		data, ferr = fn(m.in.Data, ev.payload)
		if ferr == nil {
			ferr = checkStorable(data)
		}
	}
	if ferr != nil && (errors.Is(ferr, ErrStepFailed) || core.IsPermanent(ferr)) {
		if err := m.eventOutcome(ev, eventConsumed, s.name, ""); err != nil {
			return err
		}
		st.Status, st.Due, st.Reason = StepFailed, nil, ferr.Error()
		m.record("failed", s.name, "", 0, "", ferr.Error())
		return m.giveUp(s, fmt.Sprintf("step %s failed on event %s: %s", s.name, ev.name, errReason(ferr)))
	}
	if ferr != nil {
		// Kept for an operator's Retry, which waits again and applies it.
		if err := m.eventOutcome(ev, eventPending, s.name, "could not be applied: "+ferr.Error()); err != nil {
			return err
		}
		st.Due = nil
		return m.stuck(fmt.Sprintf("step %s: applying event %s: %v", s.name, ev.name, ferr))
	}
	m.in.Data = data
	if err := m.eventOutcome(ev, eventConsumed, s.name, ""); err != nil {
		return err
	}
	st.Events = append(st.Events, ev.name)
	if !s.wait.all || len(st.Events) == len(s.wait.names) {
		m.stepDone(s, st, 0)
	}
	return nil
}

// needs reports whether a wait in state st still needs an event of name:
// one it waits for, not applied yet (an all-of wait applies each name
// once).
func (w *waitDef) needs(st *StepState, name string) bool {
	return w.has(name) && !(w.all && slices.Contains(st.Events, name))
}

// keepPending files ev as pending (if it is not already), for the wait
// that still needs it.
func (m *machine) keepPending(ev storedEvent, reason string) error {
	if ev.state == eventPending {
		return nil
	}
	return m.eventOutcome(ev, eventPending, "", reason)
}

// leftOver files an event the current step does not take: pending when
// the saga moves forward and a step from index from on waits for it,
// ignored otherwise.
func (m *machine) leftOver(ev storedEvent, from int) error {
	if m.in.Phase == PhaseForward && (m.in.Status == StatusRunning || m.in.Status == StatusStuck) && m.d.waitsFor(from, ev.name) {
		return m.keepPending(ev, "arrived before the saga waits for it")
	}
	return m.eventOutcome(ev, eventIgnored, "", "no step ahead waits for it (the saga is "+string(m.in.Status)+" at "+m.in.Step+")")
}

// onNewEvents applies or files the saga's new events (those no one
// has looked at with the saga locked), in order of arrival.
func (m *machine) onNewEvents() error {
	for {
		rows, err := m.tx.Query(m.ctx, m.o.sql.events.nextNew, m.in.ID)
		if err != nil {
			return technicalError{fmt.Errorf("saga %s: read new events: %w", m.in.ID, err)}
		}
		evs, err := scanEvents(rows)
		if err != nil {
			return technicalError{fmt.Errorf("saga %s: read new events: %w", m.in.ID, err)}
		}
		if len(evs) == 0 {
			return nil
		}
		if err := m.onEvent(evs[0]); err != nil {
			return err
		}
	}
}

// onEvent applies (or files) one new event to the locked saga.
func (m *machine) onEvent(ev storedEvent) error {
	if ev.child != "" {
		return m.onChildEvent(ev) // child.go
	}
	if m.in.Status == StatusCompleted || m.in.Status == StatusCompensated {
		return m.eventOutcome(ev, eventRefused, "", "the saga is "+string(m.in.Status))
	}
	if !m.d.waitsFor(0, ev.name) {
		return m.eventOutcome(ev, eventRefused, "", "no step of v"+strconv.Itoa(m.d.version)+" waits for it")
	}
	if m.waitOverdue() {
		// The wait timed out (or the deadline passed) before the event
		// came, and no timer pass has fired it yet: fire it first, as the
		// timer would have, and file the event after.
		m.applied = true
		if err := m.onWake(); err != nil {
			return err
		}
	}
	s, i := m.d.step(m.in.Step)
	if r, ok := m.d.groups[m.in.Step]; ok {
		s, i = nil, r[0]
	}
	if s != nil && s.wait != nil && s.wait.has(ev.name) && m.in.Status == StatusRunning && m.in.Phase == PhaseForward {
		if st := m.in.state(s.name); st.Status == StepWaiting {
			if err := m.applyEvent(s, st, ev); err != nil {
				return err
			}
			if st.Status == StepDone && m.in.Status == StatusRunning && m.in.Step == s.name {
				return m.advance(i + 1)
			}
			return nil
		}
	}
	return m.leftOver(ev, i)
}

// waitOverdue reports whether the saga waits at a wait step whose timeout
// or whose deadline is due.
func (m *machine) waitOverdue() bool {
	s, _ := m.d.step(m.in.Step)
	if s == nil || s.wait == nil || m.in.Status != StatusRunning {
		return false
	}
	st := m.in.state(s.name)
	due := func(t *time.Time) bool { return t != nil && !m.now.Before(*t) }
	return st.Status == StepWaiting && (due(st.Due) || due(m.in.DeadlineAt))
}

// eventOutcome sets a stored event's state and records it in the history
// (event "event", the state as its outcome).
func (m *machine) eventOutcome(ev storedEvent, state, step, reason string) error {
	if state != eventConsumed {
		m.fenced = true // the saga itself need not change for it
	}
	if _, err := m.tx.Exec(m.ctx, m.o.sql.events.setState, ev.arrived, state, step); err != nil {
		return technicalError{fmt.Errorf("saga %s: event %s: %w", m.in.ID, ev.id, err)}
	}
	m.hist = append(m.hist, eventHistory(m.in.ID, m.now, string(m.in.Status), ev, state, step, reason))
	return nil
}

// eventHistory is the "event" history line of ev, filed at at as state:
// its detail holds its name, id, arrival number and arrival time.
func eventHistory(sagaID string, at time.Time, status string, ev storedEvent, state, step, reason string) historyRow {
	detail, _ := json.Marshal(map[string]any{"name": ev.name, "event_id": ev.id, "arrived": ev.arrived, "arrived_at": ev.at})
	return historyRow{sagaID: sagaID, at: at, event: "event", step: step, outcome: state, status: status,
		reason: ev.name + ": " + reason, detail: detail}
}

// waitTimeout handles the expiry of wait step s.
func (m *machine) waitTimeout(s *stepDef, st *StepState) error {
	reason := fmt.Sprintf("waited %s for %s", s.wait.timeout, strings.Join(s.wait.names, ", "))
	m.record("timeout", s.name, "", 0, "", reason)
	st.Due = nil
	switch s.wait.onTimeout {
	case TimeoutContinue:
		st.Status, st.Reason = StepDone, reason
		m.record("step_done", s.name, "", 0, "timeout", "went on after the timeout")
		return m.advance(m.d.index[s.name] + 1)
	case TimeoutCompensate:
		st.Status, st.Reason = StepFailed, reason
		return m.giveUp(s, fmt.Sprintf("step %s: %s", s.name, reason))
	}
	return m.stuck(fmt.Sprintf("step %s: %s", s.name, reason))
}
