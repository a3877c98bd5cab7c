package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/sagahook"
)

// Action is an operator action on a saga.
type Action string

const (
	// ActionRetry is Orchestrator.Retry.
	ActionRetry Action = "retry"
	// ActionSkip is Orchestrator.Skip.
	ActionSkip Action = "skip"
	// ActionMarkCompensated is Orchestrator.MarkCompensated.
	ActionMarkCompensated Action = "mark-compensated"
	// ActionAbort is Orchestrator.Abort.
	ActionAbort Action = "abort"
	// ActionPause is Orchestrator.Pause.
	ActionPause Action = "pause"
	// ActionResume is Orchestrator.Resume.
	ActionResume Action = "resume"
)

func (a Action) op() func(*machine) error {
	switch a {
	case ActionRetry:
		return (*machine).opRetry
	case ActionSkip:
		return (*machine).opSkip
	case ActionMarkCompensated:
		return (*machine).opMarkCompensated
	case ActionAbort:
		return (*machine).opAbort
	case ActionPause:
		return (*machine).opPause // pause.go
	case ActionResume:
		return (*machine).opResume
	}
	return nil
}

// Request is an operator action recorded by an Operator, waiting for the
// running orchestrator to apply it (Instance.Request).
type Request struct {
	Action      Action    `json:"action"`
	Operator    string    `json:"operator"`
	Reason      string    `json:"reason"`
	RequestedAt time.Time `json:"requested_at"`
	// Step and Revision are the saga's current step and revision as the
	// request was recorded (the revision the recording gave it). The
	// orchestrator refuses the request if either changed before it came
	// to apply it: the operator decided on a state that is gone.
	Step     string `json:"step"`
	Revision int64  `json:"revision"`
	// Operation is the bulk operation that filed the request
	// (Orchestrator.Apply), "" for one of its own.
	Operation string `json:"operation,omitempty"`
	// OnBehalfOf is the planner of the bulk operation whose confirmation
	// (by Operator) filed the request, when that is someone else
	// (Actor.OnBehalfOf).
	OnBehalfOf string `json:"on_behalf_of,omitempty"`
	// From is where the request came from (Actor.From).
	From string `json:"from,omitempty"`
}

// actor is who the orchestrator acts as when it applies r.
func (r *Request) actor() Actor {
	return Actor{Operator: r.Operator, Reason: r.Reason, Operation: r.Operation, OnBehalfOf: r.OnBehalfOf, From: r.From}
}

// ErrRequestPending is returned by an Operator for a saga that has an
// operator request waiting already: one at a time.
var ErrRequestPending = errors.New("saga: an operator request is pending")

// ErrNoRequest is returned by Operator.Withdraw for a saga with no pending
// operator request (it was applied, refused or withdrawn already).
var ErrNoRequest = errors.New("saga: no operator request is pending")

// checkAction says whether the action is allowed for the saga's status and
// phase, and that the Actor is complete. The orchestrator applies it to
// every action (operateIn) and an Operator before it records a request;
// the checks that need the definition (a parallel group, the pivot) are
// the orchestrator's alone.
func checkAction(in *Instance, action Action, by Actor) error {
	if action.op() == nil {
		return fmt.Errorf("%w: unknown action %q for saga %q (want retry, skip, mark-compensated, abort, pause or resume)", ErrActionNotAllowed, action, in.ID)
	}
	if err := noActor(by); err != nil {
		return fmt.Errorf("%w: %s of saga %q: %w", ErrActionNotAllowed, action, in.ID, err)
	}
	if in.Status == StatusCompleted || in.Status == StatusCompensated {
		return fmt.Errorf("%w: %s of saga %q: it has ended (%s)", ErrActionNotAllowed, action, in.ID, in.Status)
	}
	if err := seen(in, string(action), by); err != nil {
		return err
	}
	var why string
	switch {
	case action == ActionPause && in.Status != StatusRunning && in.Status != StatusCompensating:
		why = "only a running or compensating saga can be paused (it is " + string(in.Status) + ")"
	case action == ActionResume && in.Status != StatusPaused:
		why = "the saga is not paused (it is " + string(in.Status) + ")"
	case in.Status == StatusPaused && action != ActionResume:
		why = "the saga is paused (use Resume first)"
	case in.Status == StatusScheduled && action != ActionAbort:
		why = "the saga is scheduled and has not started (use Abort to cancel it)"
	case action == ActionSkip && in.Phase != PhaseForward:
		why = "the saga is compensating (use MarkCompensated)"
	case action == ActionMarkCompensated && in.Phase != PhaseCompensating:
		why = "the saga is not compensating (use Abort first, or Skip)"
	case action == ActionAbort && in.Phase != PhaseForward:
		why = "the saga is compensating already (use Retry or MarkCompensated)"
	default:
		return nil
	}
	return fmt.Errorf("%s of saga %q: %w: %s", action, in.ID, ErrActionNotAllowed, why)
}

// noActor returns an error wrapping core.ErrNoActor, in the words the
// tools translate, when by lacks an operator or a reason.
func noActor(by Actor) error {
	if err := audit.Check(by, "Actor.Operator and Actor.Reason are required"); err != nil {
		return err
	}
	return nil
}

// seen refuses, as stale, an action whose Actor says which revision of
// the saga the operator looked at (Actor.Revision) when the saga has
// changed since: the operator decided on a state that is gone.
func seen(in *Instance, action string, by Actor) error {
	if by.Revision == 0 || by.Revision == in.Revision {
		return nil
	}
	return fmt.Errorf("%w: %s of saga %q: stale: you looked at it at revision %d; it has changed since (now revision %d, step %q, %s): look again",
		ErrActionNotAllowed, action, in.ID, by.Revision, in.Revision, in.Step, in.Status)
}

// state is a saga's state as the audit trail records it before and after
// an operator action.
func state(in *Instance) map[string]any {
	s := map[string]any{"status": in.Status, "phase": in.Phase, "step": in.Step, "revision": in.Revision}
	if in.Request != nil {
		s["request"] = in.Request.Action
	}
	return s
}

// auditSaga records an operator action on the saga in in the audit trail,
// in tx, and counts it when tx commits (after, which the caller runs then).
func (o *Orchestrator) auditSaga(ctx context.Context, tx pgx.Tx, by Actor, action, outcome string, in *Instance,
	before, after, detail any) (func(), error) {
	e := audit.Entry{Actor: by, Action: "saga." + action, Outcome: outcome, Kind: audit.KindSaga, Scope: in.Type, Target: in.ID,
		Before: before, After: after, Detail: detail}
	if err := o.trail.Write(ctx, tx, e); err != nil {
		return nil, fmt.Errorf("saga %s: %w", in.ID, err)
	}
	return func() { audit.Count(e) }, nil
}

// Request records an operator request of action (ActionRetry, ActionSkip,
// ...) for the service's running orchestrator to apply, as the
// Orchestrator's method of that name (Retry, Skip, ...), and returns the
// saga with it (Instance.Request). It needs no saga definition: it is what
// the millrace command and a console without the service's definitions
// act through, on an Orchestrator with none registered. A request is
// checked against the saga's status and phase (as the orchestrator checks
// it), recorded on the saga with its current step and revision and a
// history line "operator_request", and applied by the next timer pass of
// an Orchestrator that has the saga's type and version registered (Run,
// RunDue), as the requester; if by then the saga has changed at all
// (another step or revision than the request recorded) or the action is no
// longer allowed, the orchestrator records it as "operator_refused" and
// drops it. A pause is applied whatever step the saga has moved on to, as
// long as it is still running or compensating. Withdraw withdraws a
// pending request. It returns an error wrapping ErrNotFound for an
// unknown id, ErrActionNotAllowed for an action the saga's state forbids
// (or an incomplete Actor), and ErrRequestPending while another request
// waits; then nothing is recorded.
func (o *Orchestrator) Request(ctx context.Context, id string, action Action, by Actor) (*Instance, error) {
	var in *Instance
	var count func()
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		in, count, err = o.requestTx(ctx, tx, id, action, by)
		return err
	})
	if err != nil {
		return nil, err
	}
	count()
	return in, nil
}

// requestTx is Request in tx; the function it returns counts the request
// in the audit metrics, once tx commits.
func (o *Orchestrator) requestTx(ctx context.Context, tx pgx.Tx, id string, action Action, by Actor) (*Instance, func(), error) {
	in, err := o.lock(ctx, tx, id)
	if err != nil {
		return nil, nil, err
	}
	if err := checkAction(in, action, by); err != nil {
		return nil, nil, err
	}
	if r := in.Request; r != nil {
		return nil, nil, fmt.Errorf("%w: %s of saga %q by %s, requested at %s: wait until the orchestrator applies it",
			ErrRequestPending, r.Action, id, r.Operator, r.RequestedAt.UTC().Format(time.RFC3339))
	}
	before := state(in)
	now := o.clock.Now()
	// The row is locked: recording the request gives it the next revision.
	req := &Request{Action: action, Operator: clean(by.Operator), Reason: oneLine(by.Reason), RequestedAt: now,
		Step: in.Step, Revision: in.Revision + 1, Operation: by.Operation, OnBehalfOf: clean(by.OnBehalfOf), From: clean(by.From)}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, nil, err
	}
	if err := tx.QueryRow(ctx, o.sql.request, id, raw).Scan(&in.Revision); err != nil {
		return nil, nil, fmt.Errorf("saga %s: record operator request: %w", id, err)
	}
	if in.Revision != req.Revision {
		return nil, nil, fmt.Errorf("saga %s: record operator request: revision %d, want %d", id, in.Revision, req.Revision)
	}
	in.Request = req
	err = o.writeHistory(ctx, tx, []historyRow{{sagaID: id, at: now, event: "operator_request", step: in.Step,
		actor: by.Operator, reason: by.Reason, status: string(in.Status), detail: raw}})
	if err != nil {
		return nil, nil, err
	}
	count, err := o.auditSaga(ctx, tx, by, string(action), audit.Requested, in, before, state(in), nil)
	if err != nil {
		return nil, nil, err
	}
	return in, count, nil
}

// Withdraw withdraws the saga's pending operator request before the
// orchestrator applies it, with an "operator_withdrawn" history line
// naming by (who and why, both required) and the request, and returns the
// request it withdrew. It returns an error wrapping ErrNotFound for an
// unknown id, ErrNoRequest when no request is pending, and
// ErrActionNotAllowed for an incomplete Actor.
func (o *Orchestrator) Withdraw(ctx context.Context, id string, by Actor) (*Request, error) {
	var r *Request
	var count func()
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		var err error
		r, count, err = o.withdrawTx(ctx, tx, id, by)
		return err
	})
	if err != nil {
		return nil, err
	}
	count()
	return r, nil
}

func (o *Orchestrator) withdrawTx(ctx context.Context, tx pgx.Tx, id string, by Actor) (*Request, func(), error) {
	if err := noActor(by); err != nil {
		return nil, nil, fmt.Errorf("%w: withdraw of the request on saga %q: %w", ErrActionNotAllowed, id, err)
	}
	in, err := o.lock(ctx, tx, id)
	if err != nil {
		return nil, nil, err
	}
	r := in.Request
	if r == nil {
		return nil, nil, fmt.Errorf("%w: saga %q", ErrNoRequest, id)
	}
	if err := seen(in, "withdraw", by); err != nil {
		return nil, nil, err
	}
	before := state(in)
	if _, err := tx.Exec(ctx, o.sql.clearRequest, id); err != nil {
		return nil, nil, fmt.Errorf("saga %s: withdraw operator request: %w", id, err)
	}
	detail, err := json.Marshal(r)
	if err != nil {
		return nil, nil, err
	}
	err = o.writeHistory(ctx, tx, []historyRow{{sagaID: id, at: o.clock.Now(), event: "operator_withdrawn", step: in.Step,
		actor: by.Operator, reason: by.Reason, status: string(in.Status), detail: detail}})
	if err != nil {
		return nil, nil, err
	}
	if r.Operation != "" { // bulk.go
		if err := o.settleBulk(ctx, tx, r.Operation, id, "refused_on_apply", refusedWithdrawn, "withdrawn by "+by.Operator+": "+oneLine(by.Reason)); err != nil {
			return nil, nil, err
		}
	}
	in.Request = nil
	count, err := o.auditSaga(ctx, tx, by, "withdraw", audit.Done, in, before, state(in), json.RawMessage(detail))
	if err != nil {
		return nil, nil, err
	}
	return r, count, nil
}

// stale says why a request no longer fits the saga it was recorded on:
// the saga moved to another step or changed at all (its revision) since.
func stale(in *Instance, r *Request) error {
	switch {
	case r.Action == ActionPause && r.Revision != 0:
		return nil // a pause applies to whatever step the saga is at now (checkAction checked its status)
	case r.Revision == 0:
		return fmt.Errorf("%w: %s of saga %q: the request does not say which step and revision it was recorded at (an older millrace recorded it): record it again",
			ErrActionNotAllowed, r.Action, in.ID)
	case in.Step != r.Step || in.Revision != r.Revision:
		return fmt.Errorf("%w: %s of saga %q: stale: requested at step %q, revision %d; the saga has moved on to step %q, revision %d: look again and record a new request",
			ErrActionNotAllowed, r.Action, in.ID, r.Step, r.Revision, in.Step, in.Revision)
	}
	return nil
}

// refusal says whether an operator action's error is the saga's state
// refusing it (as opposed to a failure to carry it out).
func refusal(err error) bool {
	return errors.Is(err, ErrActionNotAllowed) || errors.Is(err, ErrNotRegistered)
}

// applyRequest carries out an operator request in tx (operateIn). A panic
// is returned as a panicked error (timer.go): the request is dropped.
func (o *Orchestrator) applyRequest(ctx context.Context, tx pgx.Tx, id string, by Actor, action Action) (after []func(), err error) {
	defer recoverPanic(&err)
	_, after, err = o.operateIn(ctx, tx, id, by, string(action), action.op(), audit.Applied)
	return after, err
}

// refused logs and records saga in's operator request as refused with
// cause (an "operator_refused" history line). The caller clears it.
func (o *Orchestrator) refused(ctx context.Context, tx pgx.Tx, in *Instance, cause error) error {
	r := in.Request
	o.logger.Info("saga: operator request refused", map[string]any{"saga_id": in.ID, "action": r.Action, "operator": r.Operator, "err": cause.Error()})
	detail, _ := json.Marshal(map[string]any{"action": r.Action, "requested_at": r.RequestedAt, "error": cause.Error(), "operation": r.Operation})
	return o.writeHistory(ctx, tx, []historyRow{{sagaID: in.ID, at: o.clock.Now(), event: "operator_refused",
		step: in.Step, actor: r.Operator, reason: r.Reason, status: string(in.Status), detail: detail}})
}

// applyPending applies the pending request of saga in, locked in tx,
// under a savepoint: applied, or refused (recorded, audited), and either
// way cleared and counted for its bulk operation (settled). A technical
// failure rolls it back alone and leaves it pending (not settled), joined
// into *failed, unless it failed too often in a row, when it is dropped as
// refused. The returned error is the transaction's.
func (o *Orchestrator) applyPending(ctx context.Context, tx pgx.Tx, in *Instance, failed *error) (after []func(), settled bool, _ error) {
	r := in.Request
	by := r.actor()
	sp, err := tx.Begin(ctx) // a savepoint: a refused action leaves nothing behind
	if err != nil {
		return nil, false, err
	}
	// refused is the outcome for a bulk operation: nil when applied.
	var refused error
	err = checkAction(in, r.Action, by) // it has ended, say, before it is stale
	if err == nil {
		err = stale(in, r)
	}
	if err == nil {
		after, err = o.applyRequest(ctx, sp, in.ID, by, r.Action)
	}
	switch {
	case err == nil:
		if err := sp.Commit(ctx); err != nil {
			return nil, false, err
		}
	case refusal(err):
		refused = err
		if err := sp.Rollback(ctx); err != nil {
			return nil, false, err
		}
		if err := o.refused(ctx, tx, in, refused); err != nil {
			return nil, false, err
		}
		count, err := o.auditSaga(ctx, tx, by, string(r.Action), audit.Refused, in, state(in), nil, map[string]string{"error": refused.Error()})
		if err != nil {
			return nil, false, err
		}
		after = append(after, count)
	default:
		// A technical failure: this request alone is rolled back and stays
		// pending for the next pass, and is dropped after
		// Config.MaxTimerFailures in a row (timer.go).
		err = fmt.Errorf("saga %s: apply operator request (%s by %s): %w", in.ID, r.Action, r.Operator, err)
		if rerr := sp.Rollback(ctx); rerr != nil || ctx.Err() != nil {
			return nil, false, errors.Join(err, rerr)
		}
		*failed = errors.Join(*failed, skipped{err}) // timer.go
		dropped, ferr := o.requestFailed(ctx, tx, in, err)
		if ferr != nil {
			return nil, false, errors.Join(err, ferr)
		}
		if !dropped {
			return nil, false, nil
		}
		refused = err
	}
	if err := o.bulkOutcome(ctx, tx, in, r, refused); err != nil { // bulk.go
		return nil, false, err
	}
	if _, err := tx.Exec(ctx, o.sql.clearRequest, in.ID); err != nil {
		return nil, false, fmt.Errorf("saga %s: clear operator request: %w", in.ID, err)
	}
	return after, true, nil
}

// applyRequests applies the pending operator requests of at most
// ClaimBatch sagas of the registered types and versions (during a rolling
// deploy, an orchestrator without a saga's version leaves its request to
// one that has it), in one transaction: each with
// the operator code path (operateIn) as its requester, or, when the saga's
// state refuses it now, recorded as "operator_refused". Either way the
// request is cleared. A failure to carry one out rolls back that request
// alone (each runs under a savepoint), recorded as "operator_failed", and
// the next pass tries again; after Config.MaxTimerFailures in a row it is
// dropped, recorded as "operator_refused" (requestFailed, timer.go).
// RunDue calls it first.
func (o *Orchestrator) applyRequests(ctx context.Context) (int, error) {
	types, versions := o.registeredPairs() // timer.go
	if len(types) == 0 {
		return 0, nil
	}
	type done struct {
		id    string
		after []func()
	}
	var applied []done
	var failed error
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		applied, failed = applied[:0], nil
		rows, err := tx.Query(ctx, o.sql.claimRequests, types, versions, o.batch)
		if err != nil {
			return fmt.Errorf("saga: claim operator requests: %w", err)
		}
		pending, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Instance, error) { return scanInstance(row) })
		if err != nil {
			return fmt.Errorf("saga: claim operator requests: %w", err)
		}
		for _, in := range pending {
			after, settled, err := o.applyPending(ctx, tx, in, &failed)
			if err != nil {
				return err
			}
			if !settled {
				continue
			}
			if err := o.callHook(ctx, sagahook.BeforeCommit, in.ID); err != nil {
				return err
			}
			applied = append(applied, done{in.ID, after})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	hookErr := failed
	for _, a := range applied {
		for _, f := range a.after {
			f()
		}
		if err := o.callHook(ctx, sagahook.AfterCommit, a.id); err != nil {
			hookErr = errors.Join(hookErr, err)
		}
	}
	return len(applied), hookErr
}
