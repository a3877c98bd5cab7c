package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
)

// Handler returns a Watermill handler for the reply topics (see
// ReplyTopics), for a Router the caller runs: each message is applied by
// HandleReplies as a batch of one, in one transaction that also holds its
// inbox dedup mark (consumer Config.Consumer), the saga's row lock, its new
// state and history, and the next command or compensation through the
// outbox. A duplicate reply is acknowledged without effect; a reply the
// saga is not waiting for (stale attempt, other step or operation, ended
// saga) is recorded in the history as fenced and acknowledged.
//
// A message that is not a saga reply fails with a core.Permanent error
// wrapping ErrBadReply: put the handler behind Watermill's PoisonQueue and
// Retry (with inbox.ShouldRetry) middleware, as AddToRouter does. The
// service runner (millrace.Service) does not use it: it applies the
// replies many per transaction (RunBatched).
func (o *Orchestrator) Handler() message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		res, err := o.HandleReplies(msg.Context(), []*message.Message{msg})
		if err != nil {
			return err
		}
		return res.Poisoned[0]
	}
}

// unregistered parks a saga whose definition version this orchestrator
// does not know (parkUnregistered), loudly.
func (o *Orchestrator) unregistered(ctx context.Context, tx pgx.Tx, in *Instance, now time.Time, r *reply) ([]func(), error) {
	m := &machine{o: o, in: in, ctx: ctx, tx: tx, now: now}
	if err := m.parkUnregistered(r); err != nil {
		return nil, err
	}
	if err := m.save(); err != nil {
		return nil, err
	}
	return m.after, nil
}

// unregisteredReason is why a saga on a definition version this
// orchestrator does not know is parked.
func unregisteredReason(in *Instance) string {
	return fmt.Sprintf("definition %s v%d is not registered with this orchestrator", in.Type, in.Version)
}

// parkUnregistered deals with m's saga, whose version is not registered:
// a running or compensating saga is parked as stuck, and so is a
// scheduled one (an operator's Retry starts it, Abort cancels it, once
// the version is registered or the saga migrated); a paused one stays
// paused with the reason as its last error (a "unregistered" history
// line), as Resume needs the version too. Reply r (if any) is held for a
// paused saga, to be applied by Resume, and recorded as fenced otherwise:
// an operator's Retry sends the step again once the version is there.
func (m *machine) parkUnregistered(r *reply) error {
	in, o := m.in, m.o
	reason := unregisteredReason(in)
	o.logger.Error("saga: instance of an unregistered definition version", ErrNotRegistered,
		map[string]any{"saga_id": in.ID, "type": in.Type, "version": in.Version, "status": in.Status})
	m.d = &def{typ: in.Type, version: in.Version, index: map[string]int{}, pivot: -1}
	if r != nil && in.Status == StatusPaused {
		if err := m.hold(*r); err != nil { // pause.go
			return err
		}
	} else if r != nil {
		m.fenced = true
		m.hist = append(m.hist, historyRow{sagaID: in.ID, at: m.now, event: "fenced", step: r.step, op: r.op,
			attempt: r.attempt, outcome: r.outcome, status: string(in.Status), reason: reason})
	}
	switch {
	case in.Status.live() || in.Status == StatusScheduled:
		if in.Status == StatusScheduled {
			reason = "scheduled, and " + reason + " (Retry starts it once it is, Abort cancels it)"
		}
		m.applied = true
		_ = m.stuck(reason)
	case in.Status == StatusPaused && in.LastError != reason:
		m.applied = true
		in.LastError = reason
		m.record("unregistered", in.Step, "", 0, "", reason)
	default:
		return nil
	}
	if mt := o.metrics; mt != nil {
		typ := in.Type
		m.after = append(m.after, func() { mt.unregistered.WithLabelValues(typ).Inc() })
	}
	return nil
}
