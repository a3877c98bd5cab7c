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

// unregistered parks a live saga whose definition version this
// orchestrator does not know as stuck, loudly.
func (o *Orchestrator) unregistered(ctx context.Context, tx pgx.Tx, in *Instance, now time.Time, r *reply) ([]func(), error) {
	m := &machine{o: o, in: in, ctx: ctx, tx: tx, now: now}
	m.parkUnregistered(r)
	if err := m.save(); err != nil {
		return nil, err
	}
	return m.after, nil
}

// parkUnregistered makes m's saga, whose version is not registered, stuck
// (if it is live), and records r (if any) as fenced: it can be replayed by
// an operator's Retry once the version is registered.
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
