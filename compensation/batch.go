package compensation

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/outbox"
)

// HandleTx handles msgs, command messages, in tx, which the caller
// commits: for each, the barrier, the action or compensation, and the
// reply through the outbox. The barrier rows of the whole batch are claimed
// in one statement, their answers written in one more, and the replies in
// one outbox write with it; each function runs under a savepoint of its
// own, so a business failure (Fail) rolls back that function's writes only
// and is replied. One message is a batch of one; RunBatched and Handle run
// their transactions through it (and answer, besides, the poisoned
// commands that can be answered, which HandleTx names in its error: see
// the package documentation).
//
// Messages of one saga step are handled in the order given; the functions
// run in message order. Before anything is written, every message is
// parsed: a message with bad saga metadata, an unknown command, a payload
// that does not decode or a reply topic the Writer refuses
// (WriterConfig.ValidateTopic) is named in a *core.BatchError, each error
// core.Permanent (ErrInvalidCommand, ErrUnknownCommand), and tx is
// untouched: take them out (poison them) and call again with the rest (for
// a single message the error is that message's own). Any other error is
// technical: roll tx back and retry. Deduplicating redelivered messages
// (the inbox's marks) is the caller's part, in tx; without it the barrier
// still keeps the effects once, and a redelivery is answered again (a
// duplicate reply, which the orchestrator ignores).
func (p *Participant) HandleTx(ctx context.Context, tx pgx.Tx, msgs ...*message.Message) error {
	return p.handleTx(ctx, tx, false, msgs)
}

// handleTx is HandleTx; with answerPoisoned (RunBatched's), a poisoned
// command that can be answered is answered (see RunBatched) instead of
// named in the error: its caller poisons it.
func (p *Participant) handleTx(ctx context.Context, tx pgx.Tx, answerPoisoned bool, msgs []*message.Message) error {
	items := make([]*item, 0, len(msgs))
	var bad []core.MessageError
	for _, msg := range msgs {
		it, err := p.item(msg)
		if err != nil && !(answerPoisoned && it != nil) {
			bad = append(bad, core.MessageError{UUID: msg.UUID, Err: err})
			continue
		}
		items = append(items, it)
	}
	if len(bad) == 1 && len(msgs) == 1 {
		return bad[0].Err
	}
	if len(bad) > 0 {
		return &core.BatchError{Errors: bad}
	}
	// The functions get the transaction as a pipeline.Tx, and find it so in
	// ctx: the savepoints between them are queued on it (handleRound).
	if _, ok := tx.(*pipeline.Tx); !ok {
		tx = &pipeline.Tx{Tx: tx}
	}
	ctx, restore := withTx(ctx, tx, msgs...)
	defer restore()
	// Rounds: the n-th message of a saga step goes to round n, so that a
	// round claims each barrier row once and sees the previous rounds'
	// answers.
	seen := map[stepKey]int{}
	var rounds [][]*item
	for _, it := range items {
		k := stepKey{it.call.SagaID, it.call.Step}
		n := seen[k]
		seen[k] = n + 1
		if n == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[n] = append(rounds[n], it)
	}
	for _, round := range rounds {
		if err := p.handleRound(ctx, tx, round); err != nil {
			return err
		}
	}
	return nil
}

// handleRound handles items of distinct saga steps.
func (p *Participant) handleRound(ctx context.Context, tx pgx.Tx, items []*item) error {
	claims, err := p.claimRound(ctx, tx, items)
	if err != nil {
		return err
	}

	// The savepoint is clean until a function runs; before the next one
	// runs it is released and taken again, so a business failure rolls back
	// that function's writes only. The two statements are queued on the
	// batch's pipeline.Tx, which the functions get: they go in the round
	// trip of the next function's first statement (or of whatever comes
	// next), not in one of their own.
	ptx := tx.(*pipeline.Tx) // HandleTx made it one
	dirty := false
	resetSavepoint := func() {
		if dirty {
			ptx.Before = append(ptx.Before, pipeline.Statement{SQL: release}, pipeline.Statement{SQL: savepoint})
			dirty = false
		}
	}
	var fin finishColumns
	events := make([]outbox.Event, 0, len(items))
	for _, it := range items {
		if why := it.refusal(); why != "" {
			// Refused (protocol.go): a failure reply, nothing else.
			p.refused(it)
			events = append(events, p.replyEvent(it.call, reply{outcome: core.OutcomeFailure, reason: cleanReason(why), payload: emptyReply}))
			continue
		}
		cl, ok := claims.of(it.call)
		if !ok {
			return fmt.Errorf("compensation: %s: claim of %s %s/%s returned no row", p.name, it.call.Operation, it.call.SagaID, it.call.Step)
		}
		ran := false
		r, err := p.decide(ctx, tx, it, cl, func() { ran = true; resetSavepoint() })
		if err != nil {
			return err
		}
		if r.failed {
			if _, err := tx.Exec(ctx, rollbackTo); err != nil {
				return fmt.Errorf("compensation: %s: rollback to savepoint: %w", p.name, err)
			}
		} else if ran {
			dirty = true
		}
		if r.finish {
			fin.add(it.call, r)
		}
		events = append(events, p.replyEvent(it.call, r))
		traceBatchReply(p, it, &events[len(events)-1]) // tracing.go
	}
	// The answers and the replies in one round trip; in RunBatched's
	// transaction (pipeline.BeginFunc), with the COMMIT.
	before := []pipeline.Statement{{SQL: release}}
	if len(fin.sagaIDs) > 0 {
		before = append(before, pipeline.Statement{SQL: p.sql.finishMany, Args: fin.args()})
	}
	err = pipeline.WriteLast(ctx, tx, before, fmt.Sprintf("compensation: %s: replies of a batch of %d", p.name, len(items)), func(wtx pgx.Tx) error {
		_, err := p.writer.WriteTx(ctx, wtx, events...)
		return err
	})
	if err != nil {
		return fmt.Errorf("compensation: %s: replies of a batch of %d: %w", p.name, len(items), err)
	}
	return nil
}

// roundClaims are the barrier rows a round claimed: the compensations'
// own rows and the actions' rows (of actions, and of the compensated
// actions), by saga step.
type roundClaims struct {
	comps, acts map[stepKey]claim
}

type stepKey struct{ saga, step string }

// of returns the claim of call's operation: its own row, and its action's.
func (c roundClaims) of(call Call) (claim, bool) {
	k := stepKey{call.SagaID, call.Step}
	a, ok := c.acts[k]
	if call.Operation != core.OperationCompensation {
		a.actInserted, a.actOutcome, a.actReply = a.inserted, a.outcome, a.reply
		return a, ok
	}
	own, okc := c.comps[k]
	return claim{inserted: own.inserted, outcome: own.outcome, reply: own.reply, reason: own.reason,
		actInserted: a.inserted, actOutcome: a.outcome, actReply: a.reply}, ok && okc
}

// claimRound claims the barrier rows of a round's items, and takes the
// savepoint, in one round trip. The claims go in a fixed lock order:
// compensation rows before action rows, each sorted by (saga id, step), so
// two batches never wait on each other in a cycle.
func (p *Participant) claimRound(ctx context.Context, tx pgx.Tx, items []*item) (roundClaims, error) {
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b *item) int {
		if c := strings.Compare(a.call.SagaID, b.call.SagaID); c != 0 {
			return c
		}
		return strings.Compare(a.call.Step, b.call.Step)
	})
	var comp, act claimColumns
	for _, it := range sorted {
		if it.refusal() != "" {
			continue // answered without the barrier
		}
		if it.call.Operation == core.OperationCompensation {
			comp.add(it.call, "", "", it.call.Attempt)
			act.add(it.call, core.OutcomeCancelled, lateReason, 0)
		} else {
			act.add(it.call, "", "", it.call.Attempt)
		}
	}
	b := &pgx.Batch{}
	if len(comp.sagaIDs) > 0 {
		b.Queue(p.sql.claimCompensations, comp.args()...)
	}
	b.Queue(p.sql.claimActions, act.args()...)
	b.Queue(savepoint)
	claims := roundClaims{comps: map[stepKey]claim{}, acts: map[stepKey]claim{}}
	br := tx.SendBatch(ctx, b)
	scan := func(into map[stepKey]claim) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		var (
			k  stepKey
			cl claim
		)
		_, err = pgx.ForEachRow(rows, []any{&k.saga, &k.step, &cl.inserted, &cl.outcome, &cl.reply, &cl.reason}, func() error {
			into[k] = cl
			return nil
		})
		return err
	}
	var err error
	if len(comp.sagaIDs) > 0 {
		err = scan(claims.comps)
	}
	if err == nil {
		err = scan(claims.acts)
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return claims, fmt.Errorf("compensation: %s: claim a batch of %d: %w", p.name, len(items), err)
	}
	return claims, nil
}

// claimColumns are the arrays of a many-row claim.
type claimColumns struct {
	sagaIDs, steps, sagaTypes, commands, outcomes, reasons []string
	attempts                                               []int32
}

func (c *claimColumns) add(call Call, outcome, reason string, attempt int) {
	c.attempts = append(c.attempts, int32(attempt))
	c.sagaIDs = append(c.sagaIDs, call.SagaID)
	c.steps = append(c.steps, call.Step)
	c.sagaTypes = append(c.sagaTypes, call.SagaType)
	c.commands = append(c.commands, call.Command)
	c.outcomes = append(c.outcomes, outcome)
	c.reasons = append(c.reasons, reason)
}

func (c *claimColumns) args() []any {
	return []any{c.sagaIDs, c.steps, c.sagaTypes, c.commands, c.outcomes, c.reasons, c.attempts}
}

// finishColumns are the arrays of a many-row finish.
type finishColumns struct {
	sagaIDs, steps, operations, outcomes, reasons []string
	empties                                       []bool
	replies                                       [][]byte
}

func (f *finishColumns) add(call Call, r reply) {
	f.sagaIDs = append(f.sagaIDs, call.SagaID)
	f.steps = append(f.steps, call.Step)
	f.operations = append(f.operations, call.Operation)
	f.outcomes = append(f.outcomes, r.outcome)
	f.reasons = append(f.reasons, r.reason)
	f.empties = append(f.empties, r.empty)
	f.replies = append(f.replies, r.payload)
}

func (f *finishColumns) args() []any {
	return []any{f.sagaIDs, f.steps, f.operations, f.outcomes, f.empties, f.replies, f.reasons}
}
