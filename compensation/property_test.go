package compensation_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
)

const seedEnv = "MILLRACE_COMPENSATION_SEED"

var errTechnical = errors.New("injected technical error")

// The property: whatever the order of an action and its compensation, each
// delivered a random number of times (new attempts and redeliveries of the
// same message), by concurrent consumers, with random technical errors and
// business failures of the functions, the participant's state ends
// consistent:
//
//   - a saga whose compensation succeeded has no net effect (reserve and
//     release both applied once, or neither);
//   - a saga never compensated has its effect exactly when its action
//     replied success, and the barrier records it;
//   - no effect without its barrier row, never an effect twice;
//   - every distinct command message got exactly one reply, and all the
//     action's replies agree.
//
// The seed is printed; set MILLRACE_COMPENSATION_SEED to replay one
// (the interleaving of the concurrent consumers still varies).
func TestPropertyBarrierKeepsStateConsistent(t *testing.T) {
	t.Parallel()
	property(t, false)
}

// The same property through HandleTx: each consumer takes up to 20
// deliveries at once into one transaction (the dedup marks of the batch in
// one statement, as a batch consumer writes them); a technical error rolls
// the whole batch back and puts it back in the queue.
func TestPropertyBatchKeepsStateConsistent(t *testing.T) {
	t.Parallel()
	property(t, true)
}

func property(t *testing.T, batched bool) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", seedEnv, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, seedEnv, seed)
	defer func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with %s=%d", seed, seedEnv, seed)
		}
	}()
	rounds := 300
	if testing.Short() {
		rounds = 60
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	var rmu sync.Mutex
	roll := func() float64 {
		rmu.Lock()
		defer rmu.Unlock()
		return rng.Float64()
	}

	b := setup(t, 8)
	type plan struct {
		id               string
		failAction       bool // the action's business failure
		actions, comps   int  // attempts sent
		compensationSent bool
	}
	plans := make([]*plan, rounds)
	byID := map[string]*plan{}
	for i := range plans {
		p := &plan{id: uuid.NewString(), failAction: rng.Float64() < 0.2, actions: rng.IntN(4), comps: rng.IntN(4)}
		if p.actions+p.comps == 0 {
			p.actions = 1
		}
		p.compensationSent = p.comps > 0
		plans[i] = p
		byID[p.id] = p
	}
	b.setFailAction(func(call compensation.Call) error {
		if roll() < 0.25 {
			return errTechnical
		}
		if byID[call.SagaID].failAction {
			return compensation.Fail("insufficient credit")
		}
		return nil
	})
	b.setFailCompensation(func(compensation.Call) error {
		switch r := roll(); {
		case r < 0.2:
			return errTechnical
		case r < 0.4:
			return compensation.Fail("ledger closed")
		}
		return nil
	})

	// Every attempt is a new message; some are redelivered as the same
	// message. All deliveries, shuffled, go to four concurrent consumers;
	// a technical error puts the delivery back in the queue (a redelivery).
	var queue []*message.Message
	for _, p := range plans {
		for a := 1; a <= p.actions; a++ {
			queue = append(queue, action(p.id, a))
		}
		for a := 1; a <= p.comps; a++ {
			queue = append(queue, compensationOf(p.id, a))
		}
	}
	for _, m := range append([]*message.Message(nil), queue...) {
		if rng.Float64() < 0.3 {
			queue = append(queue, m.Copy())
		}
	}
	rng.Shuffle(len(queue), func(i, j int) { queue[i], queue[j] = queue[j], queue[i] })

	var (
		qmu       sync.Mutex
		delivered = map[string]bool{} // message UUIDs handled successfully
	)
	next := func() []*message.Message {
		qmu.Lock()
		defer qmu.Unlock()
		n := 1
		if batched {
			n = 1 + int(roll()*20)
		}
		n = min(n, len(queue))
		ms := queue[:n:n]
		queue = queue[n:]
		return ms
	}
	deliver := func(workers int) {
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for ms := next(); len(ms) > 0; ms = next() {
					var err error
					if batched {
						err = b.handleBatch(ms)
					} else {
						err = b.handle(ms[0].Copy())
					}
					qmu.Lock()
					switch {
					case errors.Is(err, errTechnical), isDeadlock(err):
						queue = append(queue, ms...) // redelivered later
					case err != nil:
						t.Errorf("saga %s: %v", ms[0].Metadata.Get(core.MetadataSagaID), err)
					default:
						for _, m := range ms {
							delivered[m.UUID] = true
						}
					}
					qmu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	deliver(4)
	if t.Failed() {
		return
	}

	// The orchestrator retries a compensation that failed (business) with a
	// new attempt until it succeeds.
	for pass := 0; ; pass++ {
		if pass > 100 {
			t.Fatal("compensations still failing after 100 passes")
		}
		for _, p := range plans {
			if !p.compensationSent {
				continue
			}
			rs := b.replies(t, p.id)
			done := false
			for _, r := range rs {
				done = done || (r.Operation == core.OperationCompensation && r.Outcome == core.OutcomeSuccess)
			}
			if !done {
				p.comps++
				queue = append(queue, compensationOf(p.id, p.comps))
			}
		}
		if len(queue) == 0 {
			break
		}
		deliver(2)
	}

	for _, p := range plans {
		reserve, release := b.effects(t, p.id, "reserve"), b.effects(t, p.id, "release")
		held := b.count(t, `SELECT count(*) FROM `+b.reservation+` WHERE saga_id = $1`, p.id)
		actionOutcome, _, actionRow := b.barrier(t, p.id, core.OperationAction)
		rs := b.replies(t, p.id)
		var actionReplies []replyRow
		for _, r := range rs {
			if r.Operation == core.OperationAction {
				actionReplies = append(actionReplies, r)
			}
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("saga %s (%+v): reserve=%d release=%d held=%d barrier action=%q/%v replies=%+v: "+format,
				append([]any{p.id, *p, reserve, release, held, actionOutcome, actionRow, rs}, args...)...)
		}
		if reserve > 1 || release > reserve {
			fail("an effect applied twice, or undone without being applied")
		}
		if reserve == 1 && (!actionRow || actionOutcome != core.OutcomeSuccess) {
			fail("an effect without its barrier record")
		}
		if p.compensationSent {
			if held != 0 || release != reserve {
				fail("compensated saga with a net effect")
			}
		} else {
			success := len(actionReplies) > 0 && actionReplies[0].Outcome == core.OutcomeSuccess
			if success != (held == 1) || held != reserve || success == p.failAction {
				fail("uncompensated saga: effect does not match the action's reply")
			}
		}
		// In commit order, every reply repeats the one before, except after
		// a failure (no effect, not final): any attempt may be cancelled
		// once the compensation came, and a later attempt may run the
		// action again, never the failed attempt or an earlier one.
		failedAttempt := 0
		for i, r := range actionReplies {
			if i == 0 {
				continue
			}
			prev := actionReplies[i-1]
			if prev.Outcome == core.OutcomeFailure {
				a, _ := strconv.Atoi(prev.Attempt)
				failedAttempt = max(failedAttempt, a)
			}
			if r.Outcome == prev.Outcome && r.Payload == prev.Payload {
				continue
			}
			if a, _ := strconv.Atoi(r.Attempt); prev.Outcome != core.OutcomeFailure || (r.Outcome != core.OutcomeCancelled && a <= failedAttempt) {
				fail("the action's replies disagree")
			}
		}
	}
	distinct := 0
	for range delivered {
		distinct++
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.outbox_event`); n != distinct {
		t.Fatalf("replies = %d, distinct messages handled = %d: want one reply each", n, distinct)
	}
	t.Logf("%d sagas, %d distinct commands; actions run %d, compensations run %d, metrics: empty %v late %v failures %v duplicates %v",
		rounds, distinct, b.actionCalls.Load(), b.compensateCalls.Load(), b.metric(t, "empty_compensations_total"),
		b.metric(t, "late_actions_total"), b.metric(t, "business_failures_total"), b.metric(t, "duplicates_total"))
}

// handleBatch is a batch consumer: one transaction, the dedup marks of the
// batch in one statement, HandleTx for the messages not seen before.
func (b *bundle) handleBatch(msgs []*message.Message) error {
	ctx := context.Background()
	return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.UUID
		}
		rows, err := tx.Query(ctx, `INSERT INTO `+sqlident.Table(b.db.Schema, "processed_event")+` (consumer, event_id)
SELECT 'payments', id FROM unnest($1::uuid[]) AS id ON CONFLICT DO NOTHING RETURNING event_id::text`, ids)
		if err != nil {
			return err
		}
		fresh, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		keep := map[string]bool{}
		for _, id := range fresh {
			keep[id] = true
		}
		var todo []*message.Message
		for _, m := range msgs {
			if keep[m.UUID] {
				todo = append(todo, m.Copy())
				delete(keep, m.UUID) // the same message twice in one batch: once
			}
		}
		if len(todo) == 0 {
			return nil
		}
		return b.p.HandleTx(ctx, tx, todo...)
	})
}

// isDeadlock reports a deadlock PostgreSQL broke by aborting this
// transaction: a technical error, retried. (Batches lock the rows of the
// test's own reservation table in message order.)
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}
