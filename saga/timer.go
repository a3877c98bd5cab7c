package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/backoff"
	"github.com/millrace/millrace/internal/sagahook"
)

// Run fires the sagas' timers until ctx ends: every PollInterval it claims
// the sagas whose next wake-up is due (Clock.Now()) and fires their step
// timeouts, backoff retries and deadlines, and applies the pending
// operator requests (Operator) of its registered sagas (RunDue). Any number of Run loops,
// in one process or many, share the work: a saga is claimed with FOR
// UPDATE SKIP LOCKED, so one loop fires it and the others pass over it.
//
// At start Run probes the saga tables with the statements it will run (in
// a transaction it rolls back) and returns an error at once if they are
// missing ("saga tables missing in schema ...: migrations applied?", a
// wrong Schema or migrations not applied) or the role lacks a privilege
// on them; other database failures, then and later, are logged and
// retried. Then it reports, loudly (an error log and the unregistered
// metric), the live sagas of a registered type whose version is not
// registered, and parks them as stuck with that reason: nothing would ever
// move them. It returns nil when ctx ends.
func (o *Orchestrator) Run(ctx context.Context) error {
	if err := o.probe(ctx); err != nil { // probe.go
		return err
	}
	if _, err := o.ParkUnregistered(ctx); err != nil && ctx.Err() == nil {
		o.logger.Error("saga: checking for unregistered versions", err, nil)
	}
	failures := 0
	for {
		n, err := o.RunDue(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := o.poll
		switch {
		case err != nil && n == 0 && !onlySkipped(err):
			failures++
			wait = backoff.Exponential(failures, o.poll, 30*o.poll)
			o.logger.Error("saga: timers", err, nil)
		case err != nil:
			// Some sagas failed alone (they are tried again after a
			// backoff of their own), others may have moved: go on after
			// one interval, so a failing request is not retried in a
			// tight loop, nor the other sagas' timers held up.
			failures = 0
			o.logger.Error("saga: timers", err, nil)
		case n > 0:
			failures = 0
			continue // maybe more are due
		default:
			failures = 0
		}
		if !o.sleep(ctx, wait) {
			return nil
		}
	}
}

// sleep waits d, or until o is woken (child.go), and reports whether ctx
// is still alive.
func (o *Orchestrator) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-o.woken:
	}
	return true
}

// RunDue fires the timers due now (by Clock) of at most ClaimBatch sagas
// of the registered types and versions (a saga of a type or version this
// orchestrator does not have is left to one that has it), in one
// transaction, and returns how many sagas it woke. A test harness with its
// own Clock calls it after moving the clock.
//
// Each saga is woken under a savepoint of its own: one whose timer fails
// technically (a database error, a failing Hook) is rolled back alone and
// skipped, with a "timer_failed" history line, and tried again after a
// backoff, while the others commit; the error is returned, joined with the
// others'. After Config.MaxTimerFailures such failures in a row it is
// parked as stuck with the error as the reason (and counted in the
// number returned).
//
// It first applies the pending operator requests (Operator) of the sagas
// of the registered types (applyRequests, operator.go), then the events a
// signaller stored without applying them because the saga was locked
// (SignalTx); they count in the number returned.
func (o *Orchestrator) RunDue(ctx context.Context) (int, error) {
	requests, reqErr := o.applyRequests(ctx)
	events, evErr := o.applyEvents(ctx) // signal.go
	requests, reqErr = requests+events, errors.Join(reqErr, evErr)
	types, versions := o.registeredPairs()
	if len(types) == 0 || ctx.Err() != nil {
		return requests, reqErr
	}
	now := o.clock.Now()
	type done struct {
		id    string
		after []func()
	}
	var woken []done
	var failed error
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		woken, failed = woken[:0], nil
		// Relies on the partial index saga_instance_wakeup_idx.
		due, err := queryInstances(ctx, tx, o.sql.claim, now, o.batch, types, versions)
		if err != nil {
			return fmt.Errorf("saga: claim due sagas: %w", o.tablesError(err))
		}
		for _, in := range due {
			claimed := *in // as read: the machine changes in
			sp, err := tx.Begin(ctx)
			if err != nil {
				return fmt.Errorf("saga %s: savepoint: %w", in.ID, err)
			}
			after, err := o.wake(ctx, sp, in, now)
			if err == nil {
				if err := sp.Commit(ctx); err != nil {
					return fmt.Errorf("saga %s: release savepoint: %w", in.ID, err)
				}
				woken = append(woken, done{in.ID, after})
				continue
			}
			if rerr := sp.Rollback(ctx); rerr != nil || ctx.Err() != nil {
				return errors.Join(err, rerr)
			}
			parked, after, ferr := o.timerFailed(ctx, tx, &claimed, now, err)
			if ferr != nil {
				return errors.Join(err, ferr)
			}
			failed = errors.Join(failed, skipped{err})
			if parked {
				woken = append(woken, done{in.ID, after})
			}
		}
		return nil
	})
	if err != nil {
		return requests, errors.Join(reqErr, err)
	}
	hookErr := errors.Join(reqErr, failed)
	for _, w := range woken {
		for _, f := range w.after {
			f()
		}
		if err := o.callHook(ctx, sagahook.AfterCommit, w.id); err != nil {
			hookErr = errors.Join(hookErr, err)
		}
	}
	return requests + len(woken), hookErr
}

// skipped is the technical failure of one saga's timer or operator
// request in a pass that went on with the others.
type skipped struct{ err error }

func (e skipped) Error() string { return e.err.Error() }
func (e skipped) Unwrap() error { return e.err }

// onlySkipped reports whether err (maybe joined) is made of skipped
// failures only: the pass itself worked.
func onlySkipped(err error) bool {
	switch e := err.(type) {
	case skipped:
		return true
	case interface{ Unwrap() []error }:
		for _, c := range e.Unwrap() {
			if !onlySkipped(c) {
				return false
			}
		}
		return true
	}
	return false
}

// panicked is a panic in the orchestrator's handling of one saga (a bug,
// or a state no code path expects), recovered: the saga is parked as
// stuck with it at once (timerFailed) and the pass goes on.
type panicked struct {
	value any
	stack []byte
}

func (p panicked) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// recoverPanic turns a panic into a panicked error in *err.
func recoverPanic(err *error) {
	if r := recover(); r != nil {
		*err = panicked{value: r, stack: debug.Stack()}
	}
}

// wake fires one claimed saga's timer in tx. A panic is returned as a
// panicked error.
func (o *Orchestrator) wake(ctx context.Context, tx pgx.Tx, in *Instance, now time.Time) (_ []func(), err error) {
	defer recoverPanic(&err)
	if err := o.callHook(ctx, sagahook.Loaded, in.ID); err != nil {
		return nil, err
	}
	d := o.definition(in.Type, in.Version)
	var after []func()
	if d == nil {
		// Claimed as registered: only a definition registered meanwhile
		// could differ, and definitions are never unregistered.
		var err error
		if after, err = o.unregistered(ctx, tx, in, now, nil); err != nil {
			return nil, err
		}
	} else {
		mctx, span := startTransition(ctx, "timer", in.ID, in.Step, nil) // tracing.go
		m := &machine{o: o, d: d, in: in, ctx: mctx, tx: tx, now: now}
		var err error
		if (d.hasWaits() || m.hasFamily()) && in.Status != StatusScheduled { // child.go
			// Events no pass has applied yet come first (a saga that
			// failed is left to this pass: see applyEvents); a wait that
			// is overdue by then is timed out before they are filed.
			err = m.onNewEvents() // await.go
		}
		// The timer's own changes are saved even if filing the events
		// marked the machine as only fenced.
		m.applied = true
		if err == nil {
			err = m.onWake()
		}
		if err == nil {
			err = m.save()
		}
		span.End(err)
		if err != nil {
			return nil, err
		}
		after = m.after
	}
	if err := o.callHook(ctx, sagahook.BeforeCommit, in.ID); err != nil {
		return nil, err
	}
	return after, nil
}

// Events of the history for technical failures of a timer pass.
const (
	eventTimerFailed    = "timer_failed"
	eventOperatorFailed = "operator_failed"
)

// failuresInARow returns how many history lines of event (timer_failed or
// operator_failed) the saga has had since its last other event (fenced
// replies and the other kind of failure aside): its failures in a row,
// kept across restarts.
func (o *Orchestrator) failuresInARow(ctx context.Context, tx pgx.Tx, id, event string) (int, error) {
	var n int
	if err := tx.QueryRow(ctx, o.sql.failuresInARow, id, event).Scan(&n); err != nil {
		return 0, fmt.Errorf("saga %s: count failures: %w", id, err)
	}
	return n, nil
}

// timerFailed records that saga in's timer failed technically with cause
// (its own work rolled back) and reports whether the saga is now parked
// as stuck: after MaxTimerFailures in a row. Until then its next wake-up
// is moved back by a backoff, so the next passes claim other sagas first.
func (o *Orchestrator) timerFailed(ctx context.Context, tx pgx.Tx, in *Instance, now time.Time, cause error) (parked bool, after []func(), err error) {
	n, err := o.failuresInARow(ctx, tx, in.ID, eventTimerFailed)
	if err != nil {
		return false, nil, err
	}
	n++
	hist := []historyRow{{sagaID: in.ID, at: now, event: eventTimerFailed, step: in.Step, status: string(in.Status),
		reason: fmt.Sprintf("failure %d of %d in a row: %v", n, o.maxFailures, cause)}}
	reason := fmt.Sprintf("its timer failed %d times in a row: %v", n, cause)
	var p panicked
	if errors.As(cause, &p) {
		// It would panic again: parked at once, with the stack in the log.
		n, reason = o.maxFailures, fmt.Sprintf("its timer panicked: %v", p.value)
		o.logger.Error("saga: timer panicked", cause, map[string]any{"saga_id": in.ID, "stack": string(p.stack)})
	}
	if n < o.maxFailures {
		next := now.Add(backoff.Exponential(n, o.poll, 30*o.poll))
		if _, err := tx.Exec(ctx, o.sql.postpone, in.ID, next); err != nil {
			return false, nil, fmt.Errorf("saga %s: postpone its timer: %w", in.ID, err)
		}
		return false, nil, o.writeHistory(ctx, tx, hist)
	}
	if _, err := tx.Exec(ctx, o.sql.park, in.ID, oneLine(reason), now); err != nil {
		return false, nil, fmt.Errorf("saga %s: park as stuck: %w", in.ID, err)
	}
	hist = append(hist, historyRow{sagaID: in.ID, at: now, event: "stuck", step: in.Step, status: string(StatusStuck), reason: reason})
	if err := o.writeHistory(ctx, tx, hist); err != nil {
		return false, nil, err
	}
	o.logger.Error("saga: parked as stuck after repeated timer failures", cause, map[string]any{"saga_id": in.ID, "failures": n})
	in.Status, in.LastError = StatusStuck, reason
	told := &machine{o: o, in: in, ctx: ctx, tx: tx, now: now}
	if err := told.tellParent(); err != nil { // child.go: a child saga's parent is stuck with it
		return false, nil, err
	}
	after = told.after
	if mt := o.metrics; mt != nil {
		typ := in.Type
		after = append(after, func() { mt.stuck.WithLabelValues(typ).Inc() })
	}
	return true, after, nil
}

// requestFailed records that saga in's operator request failed
// technically with cause (its work rolled back) and reports whether it is
// dropped now, after MaxTimerFailures in a row, recorded as
// "operator_refused" with the error: the caller then clears it.
func (o *Orchestrator) requestFailed(ctx context.Context, tx pgx.Tx, in *Instance, cause error) (dropped bool, err error) {
	n, err := o.failuresInARow(ctx, tx, in.ID, eventOperatorFailed)
	if err != nil {
		return false, err
	}
	n++
	if errors.As(cause, new(panicked)) {
		n = max(n, o.maxFailures) // it would panic again
	}
	r, now := in.Request, o.clock.Now()
	row := historyRow{sagaID: in.ID, at: now, event: eventOperatorFailed, step: in.Step, actor: r.Operator,
		status: string(in.Status), reason: fmt.Sprintf("failure %d of %d in a row: %v", n, o.maxFailures, cause)}
	if n >= o.maxFailures {
		msg := fmt.Sprintf("failed %d times in a row: %v", n, cause)
		row.event, row.reason = "operator_refused", r.Reason
		row.detail, _ = json.Marshal(map[string]any{"action": r.Action, "requested_at": r.RequestedAt, "error": oneLine(msg)})
		o.logger.Error("saga: operator request dropped after repeated failures", cause, map[string]any{"saga_id": in.ID, "action": r.Action, "operator": r.Operator})
	}
	return n >= o.maxFailures, o.writeHistory(ctx, tx, []historyRow{row})
}

// registeredPairs returns the registered types and versions as the two
// column arrays the claim statements take.
func (o *Orchestrator) registeredPairs() (types []string, versions []int32) {
	for t, vs := range o.registered() {
		for _, v := range vs {
			types, versions = append(types, t), append(versions, int32(v))
		}
	}
	return types, versions
}

// ParkUnregistered finds the sagas of the registered types whose
// definition version is not registered and that nothing would ever move:
// it logs them as errors, counts them in the unregistered metric, parks
// the running, compensating and scheduled ones as stuck with that reason
// (an operator's Retry starts a scheduled one once its version is
// registered or it is migrated; Abort cancels it), marks the paused ones
// with the reason (they stay paused: migrate them, or register the
// version, then Resume), and refuses the operator requests pending on any
// of them ("operator_refused", ErrNotRegistered), which no orchestrator
// would apply. It returns how many sagas it parked or marked. Run calls
// it at start.
func (o *Orchestrator) ParkUnregistered(ctx context.Context) (int, error) {
	reg := o.registered()
	if len(reg) == 0 {
		return 0, nil
	}
	total := 0
	now := o.clock.Now()
	for typ, versions := range reg {
		var after []func()
		n := 0
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			after, n = after[:0], 0
			found, err := queryInstances(ctx, tx, o.sql.unregistered, typ, versions)
			if err != nil {
				return err
			}
			for _, in := range found {
				claimed := *in // as read: parking changes in
				if in.Status != StatusStuck && !(in.Status == StatusPaused && in.LastError == unregisteredReason(in)) {
					a, err := o.unregistered(ctx, tx, in, now, nil)
					if err != nil {
						return err
					}
					after = append(after, a...)
					n++
				}
				if r := claimed.Request; r != nil {
					cause := fmt.Errorf("%w: %s of saga %q: %s", ErrNotRegistered, r.Action, in.ID, unregisteredReason(in))
					if err := o.refused(ctx, tx, &claimed, cause); err != nil {
						return err
					}
					if err := o.bulkOutcome(ctx, tx, &claimed, r, cause); err != nil { // bulk.go
						return err
					}
					if _, err := tx.Exec(ctx, o.sql.clearRequest, in.ID); err != nil {
						return fmt.Errorf("saga %s: clear operator request: %w", in.ID, err)
					}
				}
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("saga: park unregistered versions of %s: %w", typ, err)
		}
		for _, f := range after {
			f()
		}
		total += n
	}
	return total, nil
}
