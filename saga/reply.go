package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
)

type pendingKey struct{}

// pending collects, across the dedup middleware's transaction, what to do
// once it committed.
type pending struct {
	sagaID string
	after  []func()
}

// Handler returns the Watermill handler for the reply topics (see
// ReplyTopics). Each reply is applied in one transaction that also holds
// its inbox dedup mark (consumer Config.Consumer), the saga's row lock, its
// new state and history, and the next command or compensation through the
// outbox: a duplicate reply is acknowledged without effect, and a crash
// anywhere leaves either all of it or none. A reply the saga is not waiting
// for (stale attempt, other step or operation, ended saga) is recorded in
// the history as fenced and acknowledged.
//
// A message that is not a saga reply fails with a core.Permanent error
// wrapping ErrBadReply: put the handler behind Watermill's PoisonQueue and
// Retry (with inbox.ShouldRetry) middleware, as for any inbox handler.
func (o *Orchestrator) Handler() message.NoPublishHandlerFunc {
	h := o.dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := core.TxFromContext(msg.Context())
		if !ok {
			return nil, outbox.ErrNoTx
		}
		return nil, o.HandleReplyTx(msg.Context(), tx, msg)
	})
	return func(msg *message.Message) error {
		ctx := msg.Context()
		p := &pending{}
		msg.SetContext(context.WithValue(ctx, pendingKey{}, p))
		defer msg.SetContext(ctx)
		if _, err := h(msg); err != nil {
			return err
		}
		if p.sagaID == "" {
			return nil // a duplicate: nothing ran
		}
		for _, f := range p.after {
			f()
		}
		return o.callHook(ctx, HookAfterCommit, p.sagaID)
	}
}

// HandleReplyTx applies one reply message in tx, which the caller commits:
// for handlers that manage their own transaction and dedup. Prefer Handler.
func (o *Orchestrator) HandleReplyTx(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
	r, err := parseReply(msg.Metadata, msg.Payload)
	if err != nil {
		return fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	r.eventID = msg.UUID
	ctx, span := startTransition(ctx, "reply", r.sagaID, r.step, msg.Metadata) // tracing.go
	after, err := o.applyReply(ctx, tx, r)
	span.End(err)
	if err != nil {
		return err
	}
	if p, ok := ctx.Value(pendingKey{}).(*pending); ok {
		p.sagaID, p.after = r.sagaID, append(p.after, after...)
	}
	return nil
}

// applyReply locks the reply's saga and applies the reply to it.
func (o *Orchestrator) applyReply(ctx context.Context, tx pgx.Tx, r reply) ([]func(), error) {
	now := o.clock.Now()
	in, err := o.lock(ctx, tx, r.sagaID)
	if errors.Is(err, ErrNotFound) {
		// A saga's row commits with its first command, so no reply can
		// come before its saga: this one belongs to a saga removed by
		// hand, or to another service's schema. Keep a trace.
		o.logger.Error("saga: reply for an unknown saga", err, map[string]any{"saga_id": r.sagaID, "step": r.step})
		return nil, o.writeHistory(ctx, tx, []historyRow{{sagaID: r.sagaID, at: now, event: "fenced", step: r.step, op: r.op,
			attempt: r.attempt, outcome: r.outcome, reason: "unknown saga"}})
	}
	if err != nil {
		return nil, err
	}
	if err := o.callHook(ctx, HookLoaded, in.ID); err != nil {
		return nil, err
	}
	d := o.definition(in.Type, in.Version)
	if d == nil {
		return o.unregistered(ctx, tx, in, now, &r)
	}
	m := &machine{o: o, d: d, in: in, ctx: ctx, tx: tx, now: now}
	if err := m.onReply(r); err != nil {
		return nil, err
	}
	if err := m.save(); err != nil {
		return nil, err
	}
	if err := o.callHook(ctx, HookBeforeCommit, in.ID); err != nil {
		return nil, err
	}
	return m.after, nil
}

// unregistered parks a live saga whose definition version this
// orchestrator does not know as stuck, loudly; the reply or timer that woke
// it is recorded (a reply as fenced: it can be replayed by an operator's
// Retry once the version is registered).
func (o *Orchestrator) unregistered(ctx context.Context, tx pgx.Tx, in *Instance, now time.Time, r *reply) ([]func(), error) {
	m := &machine{o: o, in: in, ctx: ctx, tx: tx, now: now}
	m.parkUnregistered(r)
	if err := m.save(); err != nil {
		return nil, err
	}
	return m.after, nil
}

// parkUnregistered makes m's saga, whose version is not registered, stuck
// (if it is live), and records r (if any) as fenced.
func (m *machine) parkUnregistered(r *reply) {
	in, o := m.in, m.o
	reason := fmt.Sprintf("definition %s v%d is not registered with this orchestrator", in.Type, in.Version)
	o.logger.Error("saga: instance of an unregistered definition version", ErrNotRegistered,
		map[string]any{"saga_id": in.ID, "type": in.Type, "version": in.Version, "status": in.Status})
	m.d = &def{typ: in.Type, version: in.Version, index: map[string]int{}, pivot: -1}
	if r != nil {
		m.fenced = true
		m.hist = append(m.hist, historyRow{sagaID: in.ID, at: m.now, event: "fenced", step: r.step, op: r.op,
			attempt: r.attempt, outcome: r.outcome, status: string(in.Status), reason: reason})
	}
	if in.Status.live() {
		m.applied = true
		_ = m.stuck(reason)
		if mt := o.metrics; mt != nil {
			typ := in.Type
			m.after = append(m.after, func() { mt.unregistered.WithLabelValues(typ).Inc() })
		}
	}
}
