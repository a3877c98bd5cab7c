package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/backoff"
)

// Run fires the sagas' timers until ctx ends: every PollInterval it claims
// the sagas whose next wake-up is due (Clock.Now()) and fires their step
// timeouts, backoff retries and deadlines, and applies the pending
// operator requests (Operator) of its registered sagas (RunDue). Any number of Run loops,
// in one process or many, share the work: a saga is claimed with FOR
// UPDATE SKIP LOCKED, so one loop fires it and the others pass over it.
//
// At start Run reports, loudly (an error log and the unregistered metric),
// the live sagas of a registered type whose version is not registered, and
// parks them as stuck with that reason: nothing would ever move them. It
// returns nil when ctx ends.
func (o *Orchestrator) Run(ctx context.Context) error {
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
		if err != nil {
			failures++
			wait = backoff.Exponential(failures, o.poll, 30*o.poll)
			o.logger.Error("saga: timers", err, nil)
		} else {
			failures = 0
			if n > 0 {
				continue // maybe more are due
			}
		}
		if !backoff.Sleep(ctx, wait) {
			return nil
		}
	}
}

// RunDue fires the timers due now (by Clock) of at most ClaimBatch sagas,
// in one transaction, and returns how many sagas it woke. A test harness
// with its own Clock calls it after moving the clock.
//
// It first applies the pending operator requests (Operator) of the sagas
// of the registered types (applyRequests, operator.go); they count in
// the number returned.
func (o *Orchestrator) RunDue(ctx context.Context) (int, error) {
	requests, err := o.applyRequests(ctx)
	if err != nil {
		return requests, err
	}
	now := o.clock.Now()
	type done struct {
		id    string
		after []func()
	}
	var woken []done
	err = pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		woken = woken[:0]
		due, err := queryInstances(ctx, tx, o.sql.claim, now, o.batch)
		if err != nil {
			return fmt.Errorf("saga: claim due sagas: %w", err)
		}
		for _, in := range due {
			if err := o.callHook(ctx, HookLoaded, in.ID); err != nil {
				return err
			}
			d := o.definition(in.Type, in.Version)
			var after []func()
			if d == nil {
				if after, err = o.unregistered(ctx, tx, in, now, nil); err != nil {
					return err
				}
			} else {
				mctx, span := startTransition(ctx, "timer", in.ID, in.Step, nil) // tracing.go
				m := &machine{o: o, d: d, in: in, ctx: mctx, tx: tx, now: now}
				err := m.onWake()
				span.End(err)
				if err != nil {
					return err
				}
				if err := m.save(); err != nil {
					return err
				}
				after = m.after
			}
			if err := o.callHook(ctx, HookBeforeCommit, in.ID); err != nil {
				return err
			}
			woken = append(woken, done{in.ID, after})
		}
		return nil
	})
	if err != nil {
		return requests, err
	}
	var hookErr error
	for _, w := range woken {
		for _, f := range w.after {
			f()
		}
		if err := o.callHook(ctx, HookAfterCommit, w.id); err != nil {
			hookErr = errors.Join(hookErr, err)
		}
	}
	return requests + len(woken), hookErr
}

// ParkUnregistered finds the live sagas (running or compensating) of the
// registered types whose definition version is not registered, logs them
// as errors, counts them in the unregistered metric, and parks them as
// stuck with that reason. It returns how many it parked. Run calls it at
// start.
func (o *Orchestrator) ParkUnregistered(ctx context.Context) (int, error) {
	reg := o.registered()
	if len(reg) == 0 {
		return 0, nil
	}
	total := 0
	now := o.clock.Now()
	for typ, versions := range reg {
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			found, err := queryInstances(ctx, tx, fmt.Sprintf(`SELECT %s FROM %s
 WHERE type = $1 AND status IN ('running', 'compensating') AND def_version <> ALL($2::int[])
   FOR UPDATE SKIP LOCKED`, instanceCols, o.sql.instance), typ, versions)
			if err != nil {
				return err
			}
			for _, in := range found {
				after, err := o.unregistered(ctx, tx, in, now, nil)
				if err != nil {
					return err
				}
				defer func() {
					for _, f := range after {
						f()
					}
				}()
			}
			total += len(found)
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("saga: park unregistered versions of %s: %w", typ, err)
		}
	}
	return total, nil
}
