package saga

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Status is a saga's status.
type Status string

const (
	// StatusRunning: the saga moves forward through its steps.
	StatusRunning Status = "running"
	// StatusCompensating: the saga undoes its completed steps, in reverse.
	StatusCompensating Status = "compensating"
	// StatusCompleted: every step succeeded (or was skipped). Final.
	StatusCompleted Status = "completed"
	// StatusCompensated: the saga failed and every step that took effect
	// was compensated. Final.
	StatusCompensated Status = "compensated"
	// StatusStuck: the saga needs an operator (LastError says why); no
	// timer fires for it. See Orchestrator.Retry, Skip, MarkCompensated
	// and Abort.
	StatusStuck Status = "stuck"
)

func (s Status) live() bool { return s == StatusRunning || s == StatusCompensating }

// Phase is the direction a saga moves in; a stuck saga keeps its phase.
type Phase string

const (
	PhaseForward      Phase = "forward"
	PhaseCompensating Phase = "compensating"
)

// Step statuses in StepState.Status.
const (
	StepPending      = ""             // not started
	StepRunning      = "running"      // action sent (or local step tried), waiting for the reply
	StepBackoff      = "backoff"      // the action waits for its next try (Due)
	StepDone         = "done"         // the action succeeded
	StepFailed       = "failed"       // the action failed without effect (a failure reply)
	StepUncertain    = "uncertain"    // the action was given up after timeouts: it may have taken effect
	StepCompensating = "compensating" // compensation sent, waiting for the reply
	StepCompBackoff  = "comp_backoff" // the compensation waits for its next try (Due)
	StepCompensated  = "compensated"  // the compensation succeeded (or an operator marked it so)
	StepSkipped      = "skipped"      // an operator skipped the step, or its condition (Step.When) was false
)

// StepState is one step's state in an Instance, stored as jsonb.
type StepState struct {
	Status string `json:"status"`
	// Attempt is the attempt number of the action's latest command;
	// CompensationAttempt that of the compensation. They only grow.
	Attempt             int `json:"attempt,omitempty"`
	CompensationAttempt int `json:"comp_attempt,omitempty"`
	// Tries counts tries of the current operation against its retry
	// budget (an operator's Retry resets it).
	Tries int `json:"tries,omitempty"`
	// Due is when the current try times out, or when the next try is sent.
	Due *time.Time `json:"due,omitempty"`
	// StartedAt is when the action was first sent.
	StartedAt *time.Time `json:"started_at,omitempty"`
	// Reason is the last failure's reason.
	Reason string `json:"reason,omitempty"`
	// AwaitFrom is the first action attempt whose reply the step still
	// waits for: attempts AwaitFrom to Attempt were sent and none was
	// answered yet (all but the latest timed out). A reply to any of them
	// is the step's outcome (see "Retries and late replies" in the package
	// documentation). Zero when no action attempt is unanswered.
	AwaitFrom int `json:"await_from,omitempty"`
	// Unapplied is set on a done step whose success reply could not be
	// applied to the data (OnSuccess failed; the saga is stuck): an
	// operator's Retry sends its action again, in a parallel group as
	// outside one, so the reply is not lost.
	Unapplied bool `json:"unapplied,omitempty"`
	// Events lists, for a wait step, the events applied to it so far, in
	// order (await.go).
	Events []string `json:"events,omitempty"`
}

// Instance is one saga as stored.
type Instance struct {
	ID      string
	Type    string
	Version int // the definition version it runs on
	Status  Status
	Phase   Phase
	// Step is the current step's name ("" once the saga ended).
	Step  string
	Steps map[string]*StepState
	// Data is the saga's data (JSON of the definition's data type); Input
	// is the data it was started with.
	Data, Input json.RawMessage
	// Revision grows with every change.
	Revision     int64
	NextWakeupAt *time.Time
	DeadlineAt   *time.Time
	// Attempts is the attempt number of the current operation.
	Attempts  int
	LastError string
	CreatedAt time.Time
	UpdatedAt time.Time
	EndedAt   *time.Time
	// Request is the operator request waiting for the running
	// orchestrator (Operator), nil when none. Saving the saga never
	// changes it: only applying, refusing or withdrawing it clears it.
	Request *Request
	// Parent is the id of the saga whose child step (Step.Child) started
	// this one, "" for a saga of its own.
	Parent string
	// Existing is set by Start and StartTx when the saga existed already
	// (a repeated start); it is not stored.
	Existing bool
	// Attributes are the saga's keys and search attributes (Spec.Keys,
	// Spec.Attributes) by name, as text (a number as Go formats it, a time
	// in RFC 3339), those with a value only: read by Orchestrator.Get,
	// nil elsewhere.
	Attributes map[string]string
}

func (in *Instance) state(step string) *StepState {
	st := in.Steps[step]
	if st == nil {
		st = &StepState{}
		in.Steps[step] = st
	}
	return st
}

// HistoryEntry is one line of a saga's history.
type HistoryEntry struct {
	ID     int64
	SagaID string
	At     time.Time
	// Event is what happened: started, command, reply, fenced, timeout,
	// retry, failed, compensate, completed, compensated, stuck, deadline,
	// deadline_moved, operator, operator_request, operator_refused,
	// operator_withdrawn, unregistered, migrated, timer_failed,
	// operator_failed (a technical failure of a timer pass, rolled back;
	// see Config.MaxTimerFailures), waiting (a wait step began waiting),
	// event (an event delivered to the saga: Outcome says what became of
	// it, consumed, pending, ignored or refused, or held: stored for a
	// paused or scheduled saga; Detail holds its name, id, arrival number
	// and arrival time, "arrived_at", which At is not when the event
	// waited to be filed).
	// With pause and scheduled start: paused, resumed, held (a reply
	// stored while paused), scheduled, cancelled. skipped: an operator
	// skipped the step (Actor set), or its condition was false (Outcome
	// "condition", Step.When). With child steps (Step.Child): child (the
	// step started a child saga: Detail {"child": "<id>", "type":
	// "<type>"}), child_completed, child_compensated and child_stuck (the
	// child's end, or stuck, applied; Detail {"child": "<id>"}); a child
	// step's compensation is a "command" line with Operation compensation
	// and the child in Detail.
	Event     string
	Step      string
	Operation string
	Attempt   int
	Outcome   string
	Status    Status // the saga's status after the event
	Actor     string // the operator, for operator actions
	Reason    string
	// Detail is the event's details, as JSON, or nil. A run of identical
	// fenced replies (the same step, operation, attempt, outcome, status
	// and reason, one after the other) is one entry, the first, whose
	// Detail is {"count": n, "last_at": "<when the last one arrived>"}.
	// A command's is {"topic": "<where it was sent>", "command": "<its
	// name>"}.
	Detail json.RawMessage
}

func scanInstance(row pgx.Row) (*Instance, error) {
	in := &Instance{}
	var steps []byte
	err := row.Scan(&in.ID, &in.Type, &in.Version, &in.Status, &in.Phase, &in.Step, &steps, &in.Data, &in.Input,
		&in.Revision, &in.NextWakeupAt, &in.DeadlineAt, &in.Attempts, &in.LastError, &in.CreatedAt, &in.UpdatedAt, &in.EndedAt, &in.Request, &in.Parent)
	if err != nil {
		return nil, err
	}
	in.Steps = map[string]*StepState{}
	if err := json.Unmarshal(steps, &in.Steps); err != nil {
		return nil, fmt.Errorf("saga %s: decode step state: %w", in.ID, err)
	}
	return in, nil
}

// queryInstances runs a query selecting instanceCols and returns its rows
// as instances.
func queryInstances(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) ([]*Instance, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Instance, error) { return scanInstance(row) })
}

// lock reads a saga and locks its row for the transaction (lockMany of
// one). It returns ErrNotFound when there is none.
func (o *Orchestrator) lock(ctx context.Context, tx pgx.Tx, id string) (*Instance, error) {
	ins, err := queryInstances(ctx, tx, o.sql.lockMany, []string{id})
	if err != nil {
		return nil, fmt.Errorf("saga %s: load: %w", id, err)
	}
	if len(ins) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return ins[0], nil
}

// historyRow is a history entry to write.
type historyRow struct {
	sagaID, event, step, op string
	at                      time.Time
	attempt                 int
	outcome, status, actor  string
	reason                  string
	detail                  []byte
	// count is how many identical fenced replies the row stands for
	// (see collapseFenced); 0 or 1 is one.
	count int
	// lastAt is when the last of them arrived, if count > 1.
	lastAt time.Time
}

func (o *Orchestrator) writeHistory(ctx context.Context, tx pgx.Tx, rows []historyRow) error {
	if len(rows) == 0 {
		return nil
	}
	sql, args := o.historyStatement(rows)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("saga: write history: %w", err)
	}
	return nil
}

// historyStatement returns the statement that writes rows and its
// arguments: o.sql.history, or o.sql.historyFenced when rows hold a fenced
// reply, whose repeats it collapses into one row with a count.
func (o *Orchestrator) historyStatement(rows []historyRow) (string, []any) {
	for _, r := range rows {
		if r.event == "fenced" {
			return o.sql.historyFenced, historyArgs(collapseFenced(rows))
		}
	}
	return o.sql.history, historyArgs(rows)
}

// sameFenced reports whether a and b are the same fenced reply: the same
// step, operation, attempt, outcome, status and reason of the same saga.
func sameFenced(a, b historyRow) bool {
	return a.event == "fenced" && b.event == "fenced" && a.sagaID == b.sagaID && a.step == b.step && a.op == b.op &&
		a.attempt == b.attempt && a.outcome == b.outcome && a.status == b.status && a.reason == b.reason
}

// collapseFenced merges each fenced row into the previous row of the same
// saga in rows when both are the same fenced reply, counting it.
func collapseFenced(rows []historyRow) []historyRow {
	out := make([]historyRow, 0, len(rows))
	last := map[string]int{} // saga id -> index in out of its last row
	for _, r := range rows {
		if i, ok := last[r.sagaID]; ok && sameFenced(out[i], r) {
			p := &out[i]
			p.count = max(p.count, 1) + max(r.count, 1)
			p.lastAt = r.at
			continue
		}
		last[r.sagaID] = len(out)
		out = append(out, r)
	}
	return out
}

// historyArgs are the column arrays of o.sql.history for rows.
func historyArgs(rows []historyRow) []any {
	n := len(rows)
	var (
		ids, events, steps, ops, outcomes, statuses, actors, reasons = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ats                                                          = make([]time.Time, n)
		attempts                                                     = make([]int32, n)
		details                                                      = make([]*string, n)
	)
	for i, r := range rows {
		ids[i], events[i], steps[i], ops[i] = clean(r.sagaID), r.event, clean(r.step), r.op
		outcomes[i], statuses[i], actors[i], reasons[i] = clean(r.outcome), r.status, clean(r.actor), oneLine(r.reason)
		ats[i], attempts[i] = r.at, int32(r.attempt)
		if r.detail != nil {
			s := string(storable(r.detail))
			details[i] = &s
		}
		if r.count > 1 {
			s := fmt.Sprintf(`{"count":%d,"last_at":%q}`, r.count, r.lastAt.UTC().Format(time.RFC3339Nano))
			details[i] = &s
		}
	}
	return []any{ids, ats, events, steps, ops, attempts, outcomes, statuses, actors, reasons, details}
}
