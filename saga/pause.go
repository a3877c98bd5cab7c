package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/audit"
)

const (
	// StatusPaused: an operator paused the saga (Pause). It takes no next
	// step and fires no timer; the replies that arrive meanwhile are held
	// and applied, in order, by Resume, which also pushes the current
	// step's timeout and the saga's deadline by the time it was paused.
	StatusPaused Status = "paused"
	// StatusScheduled: the saga was started with a start time (StartAt)
	// that has not come yet. Its row exists; its first step runs when the
	// start time is due, on a timer pass (Run, RunDue). Abort cancels it.
	StatusScheduled Status = "scheduled"
)

// Pause pauses a running or compensating saga: it takes no next step and
// fires no timer (its step timeout, backoff retry and deadline wait) until
// Resume. A reply that arrives meanwhile is stored, its message
// acknowledged (the reply partition goes on for the other sagas), with a
// "held" history line; Resume applies the held replies in arrival order,
// each once. Who and why are recorded ("operator" and "paused" history
// lines). Any other operator action on a paused saga is refused: resume
// it first. It returns an error wrapping ErrActionNotAllowed for a saga
// that is not running or compensating.
func (o *Orchestrator) Pause(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, string(ActionPause), (*machine).opPause)
}

// PauseTx is Pause in the caller's transaction: a saga started and paused
// in one transaction takes no step before an operator resumes it.
func (o *Orchestrator) PauseTx(ctx context.Context, tx pgx.Tx, id string, by Actor) (*Instance, error) {
	in, after, err := o.operateIn(ctx, tx, id, by, string(ActionPause), (*machine).opPause, audit.Done)
	if err != nil {
		return nil, err
	}
	for _, f := range after {
		f()
	}
	return in, nil
}

// Resume resumes a paused saga where it stood, in the status it was
// paused from. The time it was paused does not count against it: the
// current step's due time (its timeout, or its next try after a backoff)
// and the saga's deadline are pushed by that time, with a "resumed"
// history line saying by how much. Then the replies held while it was
// paused are applied in the order they arrived, in the same transaction,
// each once (one the saga no longer waits for, as it moved on with an
// earlier one, is fenced as it would have been). It returns an error
// wrapping ErrActionNotAllowed for a saga that is not paused.
func (o *Orchestrator) Resume(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, string(ActionResume), (*machine).opResume)
}

// actor returns the operator and reason of the action m applies, from the
// "operator" history line operateIn records first.
func (m *machine) actor() (string, string) {
	for _, h := range m.hist {
		if h.event == "operator" {
			return h.actor, h.reason
		}
	}
	return "", ""
}

func (m *machine) opPause() error {
	from := m.in.Status
	if from != StatusRunning && from != StatusCompensating {
		return fmt.Errorf("%w: only a running or compensating saga can be paused (it is %s)", ErrActionNotAllowed, from)
	}
	if _, err := m.tx.Exec(m.ctx, m.o.sql.pause, m.in.ID, m.now, string(from)); err != nil {
		return technicalError{fmt.Errorf("saga %s: record the pause: %w", m.in.ID, err)}
	}
	m.in.Status = StatusPaused
	who, why := m.actor()
	m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: "paused", step: m.in.Step, actor: who, reason: why,
		status: string(StatusPaused), detail: fmt.Appendf(nil, `{"resume_status":%q}`, from)})
	return nil
}

func (m *machine) opResume() error {
	if m.in.Status != StatusPaused {
		return fmt.Errorf("%w: the saga is not paused (it is %s)", ErrActionNotAllowed, m.in.Status)
	}
	var pausedAt time.Time
	var status string
	err := m.tx.QueryRow(m.ctx, m.o.sql.unpause, m.in.ID).Scan(&pausedAt, &status)
	if errors.Is(err, pgx.ErrNoRows) {
		// Not recorded (a row removed by hand): resume by the phase, with
		// nothing to push.
		pausedAt, status = m.now, string(StatusRunning)
		if m.in.Phase == PhaseCompensating {
			status = string(StatusCompensating)
		}
	} else if err != nil {
		return technicalError{fmt.Errorf("saga %s: read the pause: %w", m.in.ID, err)}
	}
	paused := max(m.now.Sub(pausedAt), 0)
	push := func(t *time.Time) *time.Time {
		if t == nil {
			return nil
		}
		p := t.Add(paused)
		return &p
	}
	from := m.in.DeadlineAt
	m.in.DeadlineAt = push(from)
	for _, st := range m.in.Steps {
		st.Due = push(st.Due)
	}
	m.in.Status = Status(status)
	m.applied = true // the state changes, whatever the held replies do
	who, why := m.actor()
	detail, _ := json.Marshal(map[string]any{"paused_at": pausedAt, "paused_for": paused.String(), "deadline_from": from, "deadline_to": m.in.DeadlineAt})
	m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: "resumed", step: m.in.Step, actor: who, reason: why,
		status: status, detail: detail})
	held, err := m.takeHeld()
	if err != nil {
		return err
	}
	for _, r := range held {
		if err := m.onReply(r); err != nil {
			return err
		}
	}
	// Then the events signalled while paused, in order of arrival.
	return m.onNewEvents()
}

// hold stores reply r of a paused saga, for Resume to apply; the saga's
// state does not change (its revision neither: a pending operator request
// stays valid).
func (m *machine) hold(r reply) error {
	_, err := m.tx.Exec(m.ctx, m.o.sql.hold, m.in.ID, m.now, r.eventID, r.step, r.op, r.attempt, r.outcome, r.reason, r.payload)
	if err != nil {
		return technicalError{fmt.Errorf("saga %s: hold a reply: %w", m.in.ID, err)}
	}
	m.held = true
	m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: "held", step: r.step, op: r.op,
		attempt: r.attempt, outcome: r.outcome, status: string(m.in.Status), reason: r.reason})
	return nil
}

// takeHeld deletes and returns the saga's held replies in arrival order.
func (m *machine) takeHeld() ([]reply, error) {
	rows, err := m.tx.Query(m.ctx, m.o.sql.takeHeld, m.in.ID)
	if err != nil {
		return nil, technicalError{fmt.Errorf("saga %s: take the held replies: %w", m.in.ID, err)}
	}
	type heldReply struct {
		seq int64
		r   reply
	}
	held, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (heldReply, error) {
		var h heldReply
		err := row.Scan(&h.seq, &h.r.eventID, &h.r.step, &h.r.op, &h.r.attempt, &h.r.outcome, &h.r.reason, &h.r.payload)
		h.r.sagaID, h.r.sagaType = m.in.ID, m.in.Type
		return h, err
	})
	if err != nil {
		return nil, technicalError{fmt.Errorf("saga %s: take the held replies: %w", m.in.ID, err)}
	}
	sort.Slice(held, func(i, j int) bool { return held[i].seq < held[j].seq })
	out := make([]reply, len(held))
	for i, h := range held {
		out[i] = h.r
	}
	return out, nil
}
