package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
)

// Child is a child step's saga (Step.Child): the step starts a saga of
// Definition, of this service, and completes when it ends.
//
// The child is started in the transaction that moves the parent to the
// step, once per attempt of the step, with the id <parent id>/<step>/<attempt>
// (a crash before that transaction commits starts neither; a repeated
// start of that id is the same saga), and Instance.Parent set to the
// parent's id. Its end is told to the parent as an event (table
// saga_event, column child), which the parent applies as it applies a
// wait step's events, on the timer pass (Run, RunDue): at once when the
// transaction that told it commits in a process whose Run is running,
// else within a PollInterval:
//
//   - the child completed: OnDone applies its data to the parent's, and
//     the parent moves on;
//   - the child compensated: the step fails (a *StepError with outcome
//     failure, as a participant's failure reply), and the parent
//     compensates (or retries the step with a new child, as its Retry
//     policy says; a retriable step's failure parks the parent as stuck);
//   - the child is stuck: the parent is stuck at the step, its reason
//     naming the child. When an operator has the child end (Retry, Skip,
//     Abort on the child), its end moves the parent on as above.
//
// Compensating the parent compensates the child: a completed (or still
// running) child is asked, by an event of its own, to compensate its
// steps, and the step is compensated when the child is. So a compensatable
// child step's Definition has no pivot (Define refuses one); a pivot or
// retriable child step's child may have one. Register registers the
// child's Definition with the parent's.
//
// A child of another service (started through a command its orchestrator
// understands) is not supported: use a remote step whose participant
// starts the saga.
type Child[D any] struct {
	// Definition is the child saga's definition. Required.
	Definition Registrable
	// Data builds the child's start data from the parent's; the result is
	// encoded as JSON and must decode as the child definition's data.
	// Defaults to the parent's data itself.
	Data func(data D) (any, error)
	// OnDone applies the completed child's data (JSON) to the parent's.
	// An error parks the parent as stuck. Defaults to leaving the data as
	// is.
	OnDone func(data *D, child json.RawMessage) error
}

// childDef is a child step's saga with its data type erased.
type childDef struct {
	def    *def
	data   func(data []byte) ([]byte, error)
	onDone func(data, child []byte) ([]byte, error)
}

// checkChild refuses what a child step must not have (Define calls it).
func checkChild[D any](s Step[D]) error {
	c := s.Child
	switch {
	case c.Definition == nil:
		return errors.New("Child.Definition is required")
	case s.Action != nil || s.Local != nil || s.Await != nil:
		return errors.New("a child step has no Action, Local or Await")
	case s.OnSuccess != nil:
		return errors.New("a child step has no OnSuccess: use Child.OnDone")
	case s.Compensation != nil || s.LocalCompensation != nil:
		return errors.New("a child step has no compensation of its own: compensating it compensates the child saga")
	case s.Group != "":
		return errors.New("a child step cannot be in a parallel group")
	case s.OnTimeout != TimeoutRetry:
		return errors.New("a child step has no OnTimeout: the child saga has its own Deadline")
	}
	if d := c.Definition.erased(); s.Kind == Compensatable && d.pivot >= 0 {
		return fmt.Errorf("a compensatable child step compensates its child saga, but %s v%d has a pivot (%q) past which it never compensates", d.typ, d.version, d.steps[d.pivot].name)
	}
	return nil
}

func eraseChild[D any](c *Child[D]) *childDef {
	cd := &childDef{def: c.Definition.erased(), data: erasePayload(c.Data)} // definition.go
	if fn := c.OnDone; fn != nil {
		cd.onDone = func(data, child []byte) ([]byte, error) {
			return withData(data, func(d *D) error { return fn(d, child) })
		}
	}
	return cd
}

// children returns the definitions of d's child steps, and theirs.
func (d *def) children() []*def {
	var out []*def
	for _, s := range d.steps {
		if s.child != nil {
			out = append(out, s.child.def)
			out = append(out, s.child.def.children()...)
		}
	}
	return out
}

// childID is the id of the child saga that attempt of step starts.
func childID(parent, step string, attempt int) string {
	return parent + "/" + step + "/" + strconv.Itoa(attempt)
}

// Names of the events between a parent and its child (saga_event.name,
// with child set).
const (
	// childEnded is told to the parent: the child ended or is stuck.
	childEnded = "child_ended"
	// compensateChild is told to a child: its parent compensates it.
	compensateChild = "compensate_child"
)

// childEnd is the payload of a childEnded event.
type childEnd struct {
	Step    string          `json:"step"`
	Attempt int             `json:"attempt"`
	Status  Status          `json:"status"`
	Reason  string          `json:"reason,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// setParent records the parent of a child saga just inserted.
func (o *Orchestrator) setParent(ctx context.Context, tx pgx.Tx, in *Instance) error {
	if in.Parent == "" {
		return nil
	}
	if _, err := tx.Exec(ctx, o.sql.setParent, in.ID, in.Parent); err != nil {
		return fmt.Errorf("saga %s: set parent: %w", in.ID, o.tablesError(err))
	}
	return nil
}

// startChild starts the child saga of child step s at its current
// attempt, in the parent's transaction.
func (m *machine) startChild(s *stepDef, st *StepState) error {
	id := childID(m.in.ID, s.name, st.Attempt)
	raw, err := s.child.data(m.in.Data)
	if err == nil {
		err = checkStorable(raw)
	}
	if err != nil {
		return m.stuck(fmt.Sprintf("step %s: build the child saga's data: %v", s.name, err))
	}
	if err := checkName(id); err != nil {
		return m.stuck(fmt.Sprintf("step %s: child saga id %q: %v", s.name, id, err))
	}
	child, err := m.o.start(m.ctx, m.tx, s.child.def, id, raw, startOptions{parent: m.in.ID})
	if errors.Is(err, ErrAlreadyStarted) {
		return m.stuck(fmt.Sprintf("step %s: start the child saga: %v", s.name, err))
	}
	if err != nil {
		return technicalError{fmt.Errorf("saga %s: step %s: start child saga %s: %w", m.in.ID, s.name, id, err)}
	}
	m.record("child", s.name, core.OperationAction, st.Attempt, "", "")
	m.hist[len(m.hist)-1].detail, _ = json.Marshal(childDetail{Child: id, Type: child.Type})
	return nil
}

// childDetail is the detail of a "child" history line: the child saga a
// step started, or was told about.
type childDetail struct {
	Child string `json:"child"`
	Type  string `json:"type,omitempty"`
}

// tellParent tells a child saga's parent that it ended, or is stuck.
func (m *machine) tellParent() error {
	if m.in.Parent == "" {
		return nil
	}
	rest, ok := strings.CutPrefix(m.in.ID, m.in.Parent+"/")
	i := strings.LastIndexByte(rest, '/')
	if !ok || i < 0 {
		return nil // not started by a child step: no step waits for it
	}
	attempt, _ := strconv.Atoi(rest[i+1:])
	end := childEnd{Step: rest[:i], Attempt: attempt, Status: m.in.Status, Reason: m.in.LastError}
	eventID := m.in.ID + "/" + string(m.in.Status)
	switch m.in.Status {
	case StatusCompleted:
		end.Data = m.in.Data
	case StatusStuck:
		eventID += "/" + strconv.FormatInt(m.in.Revision, 10) // stuck again after a retry: told again
	}
	payload, err := json.Marshal(end)
	if err != nil {
		return fmt.Errorf("saga %s: tell parent: %w", m.in.ID, err)
	}
	return m.sendEvent(m.in.Parent, childEnded, eventID, payload)
}

// sendEvent stores an event between a parent and its child for saga to,
// as new: the timer pass applies it, this process's Run at once once the
// transaction committed, any orchestrator's within its PollInterval.
// child is always the child's id.
func (m *machine) sendEvent(to, name, eventID string, payload []byte) error {
	child := m.in.ID
	if name == compensateChild {
		child = to
	}
	if _, err := m.tx.Exec(m.ctx, m.o.sql.events.insertChild, to, name, eventID, payload, m.now, child); err != nil {
		return technicalError{fmt.Errorf("saga %s: event %s for saga %s: %w", m.in.ID, name, to, err)}
	}
	m.after = append(m.after, m.o.nudge) // once committed: this process's Run applies it at once
	return nil
}

// nudge wakes Run for a timer pass now, if it waits.
func (o *Orchestrator) nudge() {
	select {
	case o.woken <- struct{}{}:
	default:
	}
}

// compensateChildStep asks the child saga of child step s (the one its
// latest attempt started) to compensate; the step is compensated when the
// child tells its end. A step whose child never started has nothing to
// undo.
func (m *machine) compensateChildStep(s *stepDef, st *StepState) error {
	st.Status, st.Due = StepCompensating, nil
	id := childID(m.in.ID, s.name, st.Attempt)
	eventID := m.in.ID + "/compensate/" + strconv.Itoa(st.CompensationAttempt)
	m.record("command", s.name, core.OperationCompensation, st.CompensationAttempt, "", "")
	m.hist[len(m.hist)-1].detail, _ = json.Marshal(childDetail{Child: id, Type: s.child.def.typ})
	return m.sendEvent(id, compensateChild, eventID, []byte(`{}`))
}

// onChildEvent applies an event between m's saga and its parent or child.
func (m *machine) onChildEvent(ev storedEvent) error {
	if ev.name == compensateChild {
		return m.onCompensateRequest(ev)
	}
	var end childEnd
	if err := json.Unmarshal(ev.payload, &end); err != nil {
		return m.eventOutcome(ev, eventIgnored, "", "not a child saga's end: "+err.Error())
	}
	s, i := m.d.step(end.Step)
	var st *StepState
	if s != nil {
		st = m.in.Steps[s.name]
	}
	if s == nil || s.child == nil || st == nil || m.in.Step != s.name || st.Attempt != end.Attempt || ev.child != childID(m.in.ID, s.name, st.Attempt) {
		return m.eventOutcome(ev, eventIgnored, end.Step, "the saga does not wait for this child saga (it is "+string(m.in.Status)+" at "+m.in.Step+")")
	}
	forward := st.Status == StepRunning && m.in.Phase == PhaseForward
	undoing := st.Status == StepCompensating && m.in.Phase == PhaseCompensating
	if !(forward || undoing) || !(m.in.Status.live() || m.in.Status == StatusStuck) || (undoing && end.Status == StatusCompleted) {
		return m.eventOutcome(ev, eventIgnored, s.name, "the step is "+st.Status+" and the saga "+string(m.in.Status))
	}
	m.applied = true
	if err := m.eventOutcome(ev, eventConsumed, s.name, string(end.Status)); err != nil {
		return err
	}
	m.record("child_"+string(end.Status), s.name, "", end.Attempt, string(end.Status), end.Reason)
	m.hist[len(m.hist)-1].detail, _ = json.Marshal(childDetail{Child: ev.child})
	what := "step " + s.name
	if undoing {
		what = "compensation of step " + s.name
	}
	switch {
	case end.Status == StatusStuck:
		return m.stuck(fmt.Sprintf("%s: child saga %s is stuck: %s", what, ev.child, end.Reason))
	case undoing:
		m.in.Status = StatusCompensating
		if err := m.restoreCompensationReason(); err != nil { // admin.go
			return err
		}
		st.Status, st.Due, st.Reason = StepCompensated, nil, ""
		m.record("step_compensated", s.name, core.OperationCompensation, st.CompensationAttempt, core.OutcomeSuccess, "")
		return m.compensateFrom(i - 1)
	}
	return m.childEnded(s, st, i, ev.child, end)
}

// childEnded moves m's saga on from child step s (index i), running, whose
// child saga child completed or compensated as end says.
func (m *machine) childEnded(s *stepDef, st *StepState, i int, child string, end childEnd) error {
	m.in.Status, m.in.LastError = StatusRunning, ""
	if end.Status == StatusCompensated {
		return m.actionFailed(s, st, &StepError{Step: s.name, Outcome: core.OutcomeFailure,
			Reason: "child saga " + child + " compensated: " + end.Reason})
	}
	if s.child.onDone != nil {
		data, err := s.child.onDone(m.in.Data, end.Data)
		if err == nil {
			err = checkStorable(data)
		}
		if err != nil {
			// The step still waits: an operator's Retry applies the
			// child's data again.
			return m.stuck(fmt.Sprintf("step %s: applying child saga %s's data: %v", s.name, child, err))
		}
		m.in.Data = data
	}
	m.stepDone(s, st, st.Attempt)
	return m.advance(i + 1)
}

// retryChild is an operator's Retry of child step s (index i) in the
// forward phase: a child that ended moves the saga on as its end does
// (the event may have been applied when the saga could not take it), one
// that never started is started again at a new attempt, and one that still
// runs (or is stuck) is refused: act on the child.
func (m *machine) retryChild(s *stepDef, st *StepState, i int) error {
	id := childID(m.in.ID, s.name, st.Attempt)
	child, err := scanInstance(m.tx.QueryRow(m.ctx, m.o.sql.get, id))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		m.in.Status, m.in.LastError = StatusRunning, "" // the past trouble is in the history
		_, err := m.try(s)                              // its condition, if any, is not asked again
		return err
	case err != nil:
		return technicalError{fmt.Errorf("saga %s: read child saga %s: %w", m.in.ID, id, err)}
	case child.Status == StatusCompleted || child.Status == StatusCompensated:
		return m.childEnded(s, st, i, id, childEnd{Step: s.name, Attempt: st.Attempt, Status: child.Status, Reason: child.LastError, Data: child.Data})
	}
	return fmt.Errorf("%w: step %s waits for its child saga %s, which is %s: act on the child", ErrActionNotAllowed, s.name, id, child.Status)
}

// onCompensateRequest applies a parent's request that m's saga, its
// child, compensate: a completed or running saga compensates (the pivot
// refused for a compensatable child step, it has none), one compensating
// already goes on, and a stuck one tells its parent so again.
func (m *machine) onCompensateRequest(ev storedEvent) error {
	reason := "its parent saga " + m.in.Parent + " compensates"
	switch {
	case m.in.Status == StatusCompleted || (m.in.Status == StatusRunning && !m.pastPivot()):
		if err := m.eventOutcome(ev, eventConsumed, m.in.Step, ""); err != nil {
			return err
		}
		m.applied = true
		return m.compensateAll(reason)
	case m.in.Status == StatusStuck:
		if err := m.eventOutcome(ev, eventIgnored, m.in.Step, "the saga is stuck"); err != nil {
			return err
		}
		return m.tellParent()
	}
	return m.eventOutcome(ev, eventIgnored, m.in.Step, "the saga is "+string(m.in.Status)+" already")
}

// compensateAll compensates every step of m's saga that took effect, from
// the current one (the last once it completed) down.
func (m *machine) compensateAll(reason string) error {
	if m.in.Status == StatusCompleted {
		m.in.EndedAt, m.in.DeadlineAt = nil, nil
		if m.d.deadline > 0 {
			m.in.DeadlineAt = m.due(m.d.deadline) // its deadline, from now, for its compensation
		}
		m.in.Step = m.d.steps[len(m.d.steps)-1].name
	} else if r, ok := m.d.groups[m.in.Step]; ok {
		m.in.Step = m.d.steps[r[1]-1].name
	}
	for _, s := range m.d.steps {
		st := m.in.Steps[s.name]
		if st != nil && (st.Status == StepRunning || st.Status == StepBackoff || st.Status == StepWaiting) {
			st.Status, st.Due = StepFailed, nil
			if s.remote && st.Attempt > 0 {
				st.Status = StepUncertain
			}
		}
	}
	return m.compensate(reason)
}

// childGone reports whether child step s has no child saga to compensate:
// its child never started (its start failed) or has compensated itself
// already. The step is then compensated.
func (m *machine) childGone(s *stepDef, st *StepState) (bool, error) {
	id := childID(m.in.ID, s.name, st.Attempt)
	var status Status
	err := m.tx.QueryRow(m.ctx, m.o.sql.statusOf, id).Scan(&status)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, technicalError{fmt.Errorf("saga %s: read child saga %s: %w", m.in.ID, id, err)}
	}
	if err == nil && status != StatusCompensated {
		return false, nil
	}
	why := "its child saga " + id + " never started"
	if err == nil {
		why = "its child saga " + id + " is compensated"
	}
	st.Status, st.Due, st.Reason = StepCompensated, nil, ""
	m.record("step_compensated", s.name, core.OperationCompensation, st.CompensationAttempt, core.OutcomeSuccess, why)
	return true, nil
}

func (d *def) erased() *def { return d }

// withChildren returns defs followed by the definitions of their child
// steps (Register registers them too).
func withChildren(defs []Registrable) []Registrable {
	out := append([]Registrable(nil), defs...)
	for _, r := range defs {
		if r == nil {
			continue
		}
		for _, c := range r.erased().children() {
			out = append(out, c)
		}
	}
	return out
}

// hasFamily reports whether m's saga has a parent or child steps: events
// between them come to it.
func (m *machine) hasFamily() bool {
	if m.in.Parent != "" {
		return true
	}
	for _, s := range m.d.steps {
		if s.child != nil {
			return true
		}
	}
	return false
}
