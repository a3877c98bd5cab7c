package saga

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/sagahook"
)

// Get returns one saga with its data and per-step state. It returns an
// error wrapping ErrNotFound when there is none.
func (o *Orchestrator) Get(ctx context.Context, id string) (*Instance, error) {
	in, err := scanInstance(o.pool.QueryRow(ctx, o.sql.get, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("saga %s: get: %w", id, err)
	}
	if in.Attributes, err = o.attributes(ctx, id); err != nil { // attr.go
		return nil, fmt.Errorf("saga %s: get: %w", id, err)
	}
	return in, nil
}

// History returns a saga's history, oldest first: every transition,
// command, reply (fenced ones too), timeout and operator action. It is
// empty, not an error, for an unknown id.
func (o *Orchestrator) History(ctx context.Context, id string) ([]HistoryEntry, error) {
	rows, err := o.pool.Query(ctx, o.sql.historyOf, id)
	if err != nil {
		return nil, fmt.Errorf("saga %s: history: %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (HistoryEntry, error) {
		var h HistoryEntry
		var status string
		err := row.Scan(&h.ID, &h.SagaID, &h.At, &h.Event, &h.Step, &h.Operation, &h.Attempt, &h.Outcome, &status, &h.Actor, &h.Reason, &h.Detail)
		h.Status = Status(status)
		return h, err
	})
	if err != nil {
		return nil, fmt.Errorf("saga %s: history: %w", id, err)
	}
	return out, nil
}

// ListParams selects sagas for List. The zero value lists every saga,
// newest first, 100 at a time.
type ListParams struct {
	// Type, if set, keeps only sagas of this type.
	Type string
	// Status, if set, keeps only sagas in this status.
	Status Status
	// CreatedBefore, if set, keeps only sagas created before it (older
	// than an age).
	CreatedBefore time.Time
	// Step, if set, keeps only sagas whose current step is this one.
	Step string
	// Error, if set, keeps only sagas whose last error matches this SQL
	// LIKE pattern (as Query.Error).
	Error string
	// Parent, if set, keeps only the child sagas of this saga (started
	// by its child steps, Step.Child).
	Parent string
	// Attrs, if set, keeps only sagas whose keys and search attributes
	// (Spec.Keys, Spec.Attributes) match every filter: name=value (a key,
	// a text attribute, or a number or time equal to it), or name>value,
	// >=, <, <= on a number or a time (RFC 3339, or a date 2006-01-02,
	// UTC): "customer=ada", "amount>100", "due<2026-01-01". A saga ended
	// keeps its attributes (not its keys' hold). A filter that cannot be
	// read is an error wrapping core.ErrInvalidListParams.
	Attrs []string
	// Cursor continues a listing: pass the Next of the previous page.
	Cursor string
	// Limit is the page size. Defaults to 100; at most 1000.
	Limit int
}

// ListResult is one page of List.
type ListResult struct {
	Sagas []*Instance
	// Next is the cursor of the next page, "" after the last one.
	Next string
}

// ErrInvalidCursor is returned by List for a cursor it did not make.
var ErrInvalidCursor = errors.New("saga: invalid list cursor")

// List lists sagas newest first, filtered by type, status, age, step,
// last error and attributes, page by page (a keyset on created_at and id,
// served by the indexes of migration 005: cheap at any depth; an attribute
// filter by saga_attr's of migration 014).
func (o *Orchestrator) List(ctx context.Context, p ListParams) (*ListResult, error) {
	if p.Limit <= 0 {
		p.Limit = 100
	}
	if p.Limit > 1000 {
		p.Limit = 1000
	}
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if p.Type != "" {
		conds = append(conds, "type = "+arg(p.Type))
	}
	if p.Status != "" {
		conds = append(conds, "status = "+arg(string(p.Status)))
	}
	if !p.CreatedBefore.IsZero() {
		conds = append(conds, "created_at < "+arg(p.CreatedBefore))
	}
	if p.Step != "" {
		conds = append(conds, "step = "+arg(p.Step))
	}
	if p.Error != "" {
		conds = append(conds, "last_error LIKE "+arg(p.Error))
	}
	if p.Parent != "" {
		conds = append(conds, "parent = "+arg(p.Parent)) // saga_instance_parent_idx
	}
	ac, err := attrConds(o.sql.attr.table, p.Attrs, arg) // attr.go
	if err != nil {
		return nil, fmt.Errorf("%w: %w", core.ErrInvalidListParams, err)
	}
	conds = append(conds, ac...)
	if p.Cursor != "" {
		at, id, err := decodeCursor(p.Cursor)
		if err != nil {
			return nil, err
		}
		conds = append(conds, fmt.Sprintf("(created_at, id) < (%s, %s)", arg(at), arg(id)))
	}
	where := ""
	if len(conds) > 0 {
		where = "WHERE " + strings.Join(conds, " AND ")
	}
	q := fmt.Sprintf(`SELECT %s FROM %s %s ORDER BY created_at DESC, id DESC LIMIT %s`, instanceCols, o.sql.instance, where, arg(p.Limit+1))
	sagas, err := queryInstances(ctx, o.pool, q, args...)
	if err != nil {
		return nil, fmt.Errorf("saga: list: %w", err)
	}
	res := &ListResult{Sagas: sagas}
	if len(res.Sagas) > p.Limit {
		res.Sagas = res.Sagas[:p.Limit]
		last := res.Sagas[p.Limit-1]
		res.Next = encodeCursor(last.CreatedAt, last.ID)
	}
	return res, nil
}

func encodeCursor(at time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(at.UTC().Format(time.RFC3339Nano) + "\x00" + id))
}

func decodeCursor(c string) (time.Time, string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("%w: %v", ErrInvalidCursor, err)
	}
	ts, id, ok := strings.Cut(string(raw), "\x00")
	if !ok {
		return time.Time{}, "", ErrInvalidCursor
	}
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("%w: %v", ErrInvalidCursor, err)
	}
	return at, id, nil
}

// Actor says who takes an operator action, why and from where
// (core.Actor): recorded in the saga's history and the audit trail.
// Operator and Reason are required. With Revision set, the action is
// refused as stale (ErrActionNotAllowed) if the saga changed since the
// operator looked at it (Instance.Revision).
type Actor = core.Actor

// Retry retries the saga's current operation now, with a new attempt
// number and a fresh retry budget: the current step's action (forward) or
// its compensation (compensating). It applies to a stuck saga, and to a
// running or compensating one (to skip a wait). A step whose success reply
// could not be applied is sent again, in a parallel group too. A saga stuck
// on an unregistered version is refused with ErrNotRegistered.
//
// Every operator action (Retry, Skip, MarkCompensated, Abort) that leaves a
// saga past its deadline running or compensating moves the deadline to the
// definition's Deadline from now, with a "deadline_moved" history line
// (see the package documentation).
func (o *Orchestrator) Retry(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, "retry", (*machine).opRetry)
}

// Skip treats the current step's action as succeeded without running it
// (someone did its work by hand) and moves on to the next step. Forward
// phase only (stuck or running). A remote step skipped after its action
// was sent is compensated if the saga later fails (it may have run).
func (o *Orchestrator) Skip(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, "skip", (*machine).opSkip)
}

// MarkCompensated treats the current step's compensation as done (someone
// undid the step by hand) and continues compensating the steps before it.
// Compensating phase only (stuck or compensating).
func (o *Orchestrator) MarkCompensated(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, "mark-compensated", (*machine).opMarkCompensated)
}

// Abort stops the saga's forward run and compensates the steps that took
// effect (the current one too if its action was sent: the participant's
// barrier makes that safe). Forward phase before the pivot only. Abort of
// a scheduled saga (StartAt) cancels it before it starts: it ends as
// compensated, nothing having run, with a "cancelled" history line, and
// its start never comes; nothing of the definition runs either (no
// compensation: no step took effect), so the caller's own rows written
// with the start stay as they are.
func (o *Orchestrator) Abort(ctx context.Context, id string, by Actor) (*Instance, error) {
	return o.operate(ctx, id, by, "abort", (*machine).opAbort)
}

func (o *Orchestrator) operate(ctx context.Context, id string, by Actor, action string, fn func(*machine) error) (*Instance, error) {
	var in *Instance
	var after []func()
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		in, after, err = o.operateIn(ctx, tx, id, by, action, fn, audit.Done)
		if err != nil {
			return err
		}
		return o.callHook(ctx, sagahook.BeforeCommit, id)
	})
	if err != nil {
		return nil, err
	}
	for _, f := range after {
		f()
	}
	return in, o.callHook(ctx, sagahook.AfterCommit, id)
}

// operateIn carries out an operator action in tx, and records it in the
// saga's history and the audit trail with outcome (audit.Done, or
// audit.Applied for a request the orchestrator applies); the functions it
// returns are to run once tx commits.
func (o *Orchestrator) operateIn(ctx context.Context, tx pgx.Tx, id string, by Actor, action string, fn func(*machine) error,
	outcome string) (*Instance, []func(), error) {
	in, err := o.lock(ctx, tx, id)
	if err != nil {
		return nil, nil, err
	}
	if err := checkAction(in, Action(action), by); err != nil { // operator.go: the checks a request gets too
		return nil, nil, err
	}
	before := state(in)
	if err := o.callHook(ctx, sagahook.Loaded, id); err != nil {
		return nil, nil, err
	}
	d := o.definition(in.Type, in.Version)
	if d == nil {
		return nil, nil, fmt.Errorf("%w: %s of saga %q: %s v%d", ErrNotRegistered, action, id, in.Type, in.Version)
	}
	ctx, span := startTransition(ctx, "operator", id, in.Step, nil) // tracing.go
	defer span.End(nil)
	// An operator action always writes the saga (its revision, at least),
	// whatever filing stored events marked the machine as.
	m := &machine{o: o, d: d, in: in, ctx: ctx, tx: tx, now: o.clock.Now(), applied: true}
	m.hist = append(m.hist, historyRow{sagaID: id, at: m.now, event: "operator", step: in.Step, actor: by.Operator,
		reason: by.Reason, status: string(in.Status), detail: operatorDetail(action, by)})
	if err := fn(m); err != nil {
		return nil, nil, fmt.Errorf("%s of saga %q: %w", action, id, err)
	}
	m.moveDeadline(by)
	if err := m.save(); err != nil {
		return nil, nil, err
	}
	after := state(in)
	delete(after, "revision") // saved: the next one
	count, err := o.auditSaga(ctx, tx, by, action, outcome, in, before, after, nil)
	if err != nil {
		return nil, nil, err
	}
	return in, append(m.after, count), nil
}

// moveDeadline moves the deadline of a saga that an operator action
// leaves running or compensating although its deadline has passed (it
// passed while the saga was stuck, when no timer fires): to the
// definition's Deadline from now (none if the definition has none any
// more), with a "deadline_moved" history line naming the operator and the
// reason. Without it the next timer pass would turn the operator's action
// into the deadline's compensation or parking.
func (m *machine) moveDeadline(by Actor) {
	from := m.in.DeadlineAt
	if !m.in.Status.live() || from == nil || m.now.Before(*from) {
		return
	}
	var to *time.Time
	if m.d.deadline > 0 {
		to = m.due(m.d.deadline)
	}
	m.in.DeadlineAt = to
	detail, _ := json.Marshal(map[string]any{"from": from, "to": to})
	m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: "deadline_moved", step: m.in.Step, actor: by.Operator,
		reason: by.Reason, status: string(m.in.Status), detail: detail})
}

func (m *machine) current() (*stepDef, int, *StepState, error) {
	s, i := m.d.step(m.in.Step)
	if s == nil {
		return nil, 0, nil, fmt.Errorf("%w: no current step", ErrActionNotAllowed)
	}
	return s, i, m.in.state(s.name), nil
}

// groupOp applies an operator action to the members of the parallel group
// the saga is in, if it is in one.
func (m *machine) groupOp(action string) (handled bool, err error) {
	r, ok := m.d.groups[m.in.Step]
	if !ok {
		return false, nil
	}
	g := m.in.Step
	members := m.d.steps[r[0]:r[1]]
	switch action {
	case "retry":
		m.in.Status, m.in.LastError = StatusRunning, ""
		for _, s := range members {
			st := m.in.state(s.name)
			if (st.Status == StepDone && !st.Unapplied) || st.Status == StepSkipped {
				continue
			}
			st.Tries, st.Due = 0, nil
			if _, err := m.tryIf(s); err != nil { // when.go
				return true, err
			}
			if m.in.Status != StatusRunning {
				return true, nil
			}
		}
		return true, m.settleGroup(g)
	case "skip":
		for _, s := range members {
			if st := m.in.state(s.name); st.Status != StepDone {
				st.Status, st.Due = StepSkipped, nil
				m.record("skipped", s.name, "", 0, "", "")
			}
		}
		return true, m.advance(r[1])
	case "abort":
		if members[0].kind != Compensatable {
			return true, fmt.Errorf("%w: group %s is after the pivot and never compensates (use Retry or Skip)", ErrActionNotAllowed, g)
		}
		for _, s := range members {
			st := m.in.state(s.name)
			if st.Status == StepRunning || st.Status == StepBackoff {
				st.Status = StepFailed
				if s.remote && st.Attempt > 0 {
					st.Status = StepUncertain
				}
			}
			st.Due = nil
		}
		m.in.Step = members[len(members)-1].name
		return true, m.compensate("aborted by an operator")
	}
	return true, fmt.Errorf("%w: group %s is running (use Retry, Skip or Abort)", ErrActionNotAllowed, g)
}

func (m *machine) opRetry() error {
	if m.neverStarted() { // schedule.go: stuck before its start
		m.in.LastError = ""
		return m.startNow()
	}
	if ok, err := m.groupOp("retry"); ok {
		return err
	}
	s, i, st, err := m.current()
	if err != nil {
		return err
	}
	st.Tries, st.Due = 0, nil
	if m.in.Phase == PhaseCompensating {
		if st.Status != StepCompensating && st.Status != StepCompBackoff {
			// Stuck before the compensation was ever sent (a payload bug).
			st.Status = StepCompensating
		}
		m.in.Status = StatusCompensating
		if err := m.restoreCompensationReason(); err != nil {
			return err
		}
		return m.compensateFrom(i)
	}
	if s.child != nil && st.Status == StepRunning {
		return m.retryChild(s, st, i) // child.go
	}
	m.in.LastError = "" // the past trouble is in the history
	return m.advance(i)
}

// restoreCompensationReason makes the saga's last error the reason it
// compensates for again (its last "compensate" history line), in place of
// the trouble an operator is acting on: a saga that recovers ends with why
// it compensated, not with a failure that is past.
func (m *machine) restoreCompensationReason() error {
	var reason string
	err := m.tx.QueryRow(m.ctx, m.o.sql.compensateReason, m.in.ID).Scan(&reason)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return technicalError{fmt.Errorf("saga %s: read why it compensates: %w", m.in.ID, err)}
	}
	m.in.LastError = reason
	return nil
}

func (m *machine) opSkip() error {
	if ok, err := m.groupOp("skip"); ok {
		return err
	}
	s, i, st, err := m.current()
	if err != nil {
		return err
	}
	st.Status, st.Due = StepSkipped, nil
	m.record("skipped", s.name, "", 0, "", "")
	m.in.LastError = "" // the past trouble is in the history
	return m.advance(i + 1)
}

func (m *machine) opMarkCompensated() error {
	if ok, err := m.groupOp("mark-compensated"); ok {
		return err
	}
	s, i, st, err := m.current()
	if err != nil {
		return err
	}
	st.Status, st.Due = StepCompensated, nil
	m.record("step_compensated", s.name, "", 0, "", "marked by operator")
	if err := m.restoreCompensationReason(); err != nil {
		return err
	}
	return m.compensateFrom(i - 1)
}

func (m *machine) opAbort() error {
	if m.in.Status == StatusScheduled || m.neverStarted() {
		return m.cancelScheduled() // schedule.go
	}
	if m.in.Phase == PhaseForward && !m.pastPivot() {
		if ok, err := m.groupOp("abort"); ok {
			return err
		}
	}
	s, _, st, err := m.current()
	if err != nil {
		return err
	}
	if m.pastPivot() {
		return fmt.Errorf("%w: the saga is past its pivot and never compensates (use Retry or Skip)", ErrActionNotAllowed)
	}
	if s.kind == Pivot && s.remote && st.Attempt > 0 && st.Status != StepFailed {
		return fmt.Errorf("%w: the pivot step %s may have taken effect (use Retry or Skip)", ErrActionNotAllowed, s.name)
	}
	if st.Status == StepRunning || st.Status == StepBackoff {
		if s.remote {
			st.Status = StepUncertain
		} else {
			st.Status = StepFailed
		}
	}
	st.Due = nil
	return m.compensate("aborted by an operator")
}
