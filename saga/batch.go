package saga

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/fetch"
	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/internal/tracing"
	"github.com/millrace/millrace/outbox"
)

// BatchConfig configures RunBatched.
type BatchConfig struct {
	// Subscriber reads the reply topics. Required. When it is also a
	// kafka.BatchSubscriber (kafka.Subscriber is), the replies are read
	// whole fetches at a time: a transaction takes what the partitions
	// have delivered, up to BatchSize, without waiting for more.
	Subscriber message.Subscriber
	// Poison receives the messages that are not saga replies (ErrBadReply,
	// or no usable event id), with the reason in metadata
	// "reason_poisoned" and the reply topic in "topic_poisoned"; each is
	// logged at error level with the reason (Config.Logger) and counted
	// (Metrics, poisoned_total). Required: nothing is lost.
	Poison message.Publisher
	// PoisonTopic is the topic of Poison. Defaults to the reply topic +
	// ".poison".
	PoisonTopic string
	// BatchSize is the most replies one transaction applies. Defaults to
	// core.DefaultBatchSize.
	BatchSize int
	// BatchWait is how long a batch waits for more replies after its
	// first, with a Subscriber that delivers one message at a time (not
	// used with a core.BatchSubscriber). Defaults to core.DefaultBatchWait.
	BatchWait time.Duration
	// Workers is the number of batches in flight at once. Defaults to 1:
	// while a batch's transaction runs, the next batch gathers what
	// arrives, so batches grow with the load. More workers help when a
	// batch waits on something other than this machine's CPU (round trips
	// to a distant database); on two cores shared with PostgreSQL and the
	// broker, one worker per consumer completed more sagas per second than
	// two or four in each run compared, at a lower latency (the bench's
	// saga group; the CHANGELOG has the figures).
	Workers int
}

// RunBatched consumes the reply topics (ReplyTopics) from cfg.Subscriber
// and applies the replies many per transaction, until ctx ends: one
// statement records the inbox dedup marks of a whole batch, one locks its
// sagas (SELECT ... FOR NO KEY UPDATE, in id order, so concurrent batches never
// deadlock), and one each writes the sagas' new state, their history and
// the next commands. The guarantees are Handler's: a reply is applied at
// most once, with its state change and its next command in one
// transaction. A failed batch rolls back whole and its replies are applied
// again one per transaction: the ones that fail again are nacked for
// redelivery and the others acknowledged, so one reply that cannot be
// applied holds up no other saga's (from a kafka.BatchSubscriber, the
// replies after a failing one in its partition are nacked with it, and
// come again in order). Use it instead of AddToRouter when throughput
// matters. With kafka.Subscriber a batch is whatever its partitions have
// fetched, closed as soon as nothing more is ready; with a subscriber of
// one message at a time (watermill-kafka: one per partition in flight),
// the batches are bounded by the partitions and BatchWait.
func (o *Orchestrator) RunBatched(ctx context.Context, cfg BatchConfig) error {
	if cfg.Subscriber == nil || cfg.Poison == nil {
		return fmt.Errorf("%w: saga: BatchConfig.Subscriber and Poison are required", core.ErrConfig)
	}
	topics := o.ReplyTopics()
	if len(topics) == 0 {
		return fmt.Errorf("%w: saga: RunBatched: no definitions registered", core.ErrConfig)
	}
	c := fetch.Consumer{What: "saga: reply", Max: cmp.Or(max(cfg.BatchSize, 0), core.DefaultBatchSize),
		Wait: cmp.Or(max(cfg.BatchWait, 0), core.DefaultBatchWait), Workers: cmp.Or(max(cfg.Workers, 0), 1),
		Poison: o.poisonPublisher(cfg.Poison), PoisonTopic: cfg.PoisonTopic, Logger: o.logger, OnBatch: o.metrics.replyBatch}
	return c.Run(ctx, cfg.Subscriber, topics, func(ctx context.Context, msgs []*message.Message) ([]error, error) {
		res, err := o.HandleReplies(ctx, msgs)
		if err != nil {
			return nil, err
		}
		poisoned := make([]error, len(msgs))
		for i, err := range res.Poisoned {
			poisoned[i] = err
		}
		return poisoned, nil
	})
}

// BatchResult says what HandleReplies did with each message.
type BatchResult struct {
	// Poisoned holds, per message index, the permanent error of a message
	// that is not a saga reply (it was not applied; dead-letter it).
	Poisoned map[int]error
	// Duplicates is the number of messages the inbox had seen before.
	Duplicates int
	// Fenced is the number of replies recorded and ignored.
	Fenced int
}

// HandleReplies applies many reply messages in one transaction of its
// own; see RunBatched. An error means nothing was applied.
func (o *Orchestrator) HandleReplies(ctx context.Context, msgs []*message.Message) (*BatchResult, error) {
	var res *BatchResult
	var after []func()
	var ids []string
	// saveMany leaves the batch's writes queued: they go out with the
	// COMMIT, in one round trip.
	err := pipeline.BeginFunc(ctx, o.pool, func(tx *pipeline.Tx) error {
		var err error
		res, after, ids, err = o.handleRepliesTx(ctx, tx, msgs)
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, f := range after {
		f()
	}
	if o.hook != nil {
		for _, id := range ids {
			if err := o.callHook(ctx, sagahook.AfterCommit, id); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

func (o *Orchestrator) handleRepliesTx(ctx context.Context, tx pgx.Tx, msgs []*message.Message) (*BatchResult, []func(), []string, error) {
	res := &BatchResult{Poisoned: map[int]error{}}
	replies := parseReplies(msgs, res)
	locked, err := o.markAndLock(ctx, tx, msgs, replies, res)
	if err != nil || locked == nil {
		return res, nil, nil, err
	}
	now := o.clock.Now()
	machines := make(map[string]*machine, len(locked))
	for _, in := range locked {
		machines[in.ID] = &machine{o: o, in: in, ctx: ctx, tx: tx, now: now}
	}
	var unknown []historyRow
	var order []*machine
	for i, r := range replies {
		if r == nil {
			continue
		}
		m := machines[r.sagaID]
		if m == nil {
			o.logger.Error("saga: reply for an unknown saga", ErrNotFound, map[string]any{"saga_id": r.sagaID, "step": r.step})
			unknown = append(unknown, historyRow{sagaID: r.sagaID, at: now, event: "fenced", step: r.step, op: r.op,
				attempt: r.attempt, outcome: r.outcome, reason: "unknown saga"})
			res.Fenced++
			continue
		}
		if m.d == nil { // the saga's first reply of the batch
			if err := o.callHook(ctx, sagahook.Loaded, m.in.ID); err != nil {
				return nil, nil, nil, err
			}
			order = append(order, m)
			if m.d = o.definition(m.in.Type, m.in.Version); m.d == nil {
				if err := m.parkUnregistered(r); err != nil {
					return nil, nil, nil, err
				}
				if m.fenced {
					res.Fenced++
				}
				continue
			}
		}
		if err := m.applyReply(*r, msgs[i].Metadata); err != nil {
			return nil, nil, nil, err
		}
		if m.fenced {
			res.Fenced++
		}
	}
	var after []func()
	var ids []string
	for _, m := range order {
		if err := o.callHook(ctx, sagahook.BeforeCommit, m.in.ID); err != nil {
			return nil, nil, nil, err
		}
		after = append(after, m.after...)
		ids = append(ids, m.in.ID)
	}
	if err := o.saveMany(ctx, tx, order, unknown); err != nil {
		return nil, nil, nil, err
	}
	return res, after, ids, nil
}

// applyReply applies one reply of a batch to m's saga, in a span of its
// own.
func (m *machine) applyReply(r reply, md message.Metadata) error {
	m.fenced = false
	var span *tracing.Span
	m.ctx, span = startTransition(m.ctx, "reply", r.sagaID, r.step, md) // tracing.go
	err := m.onReply(r)
	span.End(err)
	return err
}

// parseReplies parses msgs: a message that is not a saga reply, or has no
// usable event id, is poisoned in res and has no reply (nil).
func parseReplies(msgs []*message.Message, res *BatchResult) []*reply {
	replies := make([]*reply, len(msgs))
	for i, msg := range msgs {
		r, err := parseReply(msg.Metadata, msg.Payload)
		if err != nil {
			res.Poisoned[i] = fmt.Errorf("message %s: %w", msg.UUID, err)
			continue
		}
		id, err := inbox.DefaultEventID(msg)
		if err == nil {
			_, err = uuid.Parse(id) // MarkTx would refuse it: poison it alone
		}
		if err != nil {
			res.Poisoned[i] = core.Permanent(fmt.Errorf("%w: message %q: event id %q", inbox.ErrNoEventID, msg.UUID, id))
			continue
		}
		r.eventID = msg.UUID
		replies[i] = &r
	}
	return replies
}

// markAndLock records the dedup marks of the replies in one statement (the
// inbox's MarkTx), drops the duplicates from replies (a mark that existed,
// or repeats within the batch), and locks the batch's sagas in id order,
// so that concurrent batches never deadlock. The lock goes in the marks'
// round trip: the sagas of duplicates are locked too, and left as they
// are. It returns nil when no reply is left to apply.
func (o *Orchestrator) markAndLock(ctx context.Context, tx pgx.Tx, msgs []*message.Message, replies []*reply, res *BatchResult) ([]*Instance, error) {
	var marked []*message.Message // the replies' messages, in order
	var markedAt []int            // their index in msgs
	var candidates []string
	seen := map[string]bool{}
	for i, r := range replies {
		if r == nil {
			continue
		}
		marked, markedAt = append(marked, msgs[i]), append(markedAt, i)
		if !seen[r.sagaID] {
			seen[r.sagaID] = true
			candidates = append(candidates, r.sagaID)
		}
	}
	if len(marked) == 0 {
		return nil, nil
	}
	mt := &markThenLock{Tx: tx, lock: o.sql.lockMany, ids: candidates}
	fresh, err := o.dedup.MarkTx(ctx, mt, marked...)
	if err != nil {
		return nil, fmt.Errorf("saga: record dedup marks: %w", err)
	}
	var sagaIDs []string
	seen = map[string]bool{}
	for k, i := range markedAt {
		if !fresh[k] {
			replies[i] = nil
			res.Duplicates++
			continue
		}
		if id := replies[i].sagaID; !seen[id] {
			seen[id] = true
			sagaIDs = append(sagaIDs, id)
		}
	}
	locked, err := mt.locked, mt.err
	if !mt.sent {
		locked, err = queryInstances(ctx, tx, o.sql.lockMany, sagaIDs)
	}
	if err != nil {
		return nil, fmt.Errorf("saga: lock sagas: %w", err)
	}
	return locked, nil
}

// markThenLock is a batch's transaction as the inbox's MarkTx sees it: its
// first Query (the dedup marks) takes the lock of the batch's sagas (lock,
// on ids) behind it in the same round trip, and the locked rows are read
// when the marks' rows are closed. sent says it did; locked and err are
// then the lock's outcome.
type markThenLock struct {
	pgx.Tx
	lock   string
	ids    []string
	sent   bool
	locked []*Instance
	err    error
}

func (t *markThenLock) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.sent {
		return t.Tx.Query(ctx, sql, args...)
	}
	t.sent = true
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue(t.lock, t.ids)
	br := t.Tx.SendBatch(ctx, b)
	rows, err := br.Query()
	if err != nil {
		t.err = err
		_ = br.Close()
		return nil, err
	}
	return &markRows{Rows: rows, t: t, br: br}, nil
}

// markRows are the marks' rows; closing them reads the lock's.
type markRows struct {
	pgx.Rows
	t  *markThenLock
	br pgx.BatchResults
}

func (r *markRows) Close() {
	r.Rows.Close()
	if r.br == nil {
		return
	}
	br := r.br
	r.br = nil
	if err := r.Rows.Err(); err != nil {
		r.t.err = err // the lock did not run
	} else {
		rows, err := br.Query()
		if err == nil {
			r.t.locked, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Instance, error) { return scanInstance(row) })
		}
		r.t.err = err
	}
	if err := br.Close(); err != nil && r.t.err == nil {
		r.t.err = err
	}
}

// saveMany writes the new state of many sagas, their keys and attributes,
// their history and their commands: four statements, whatever the number
// of sagas.
func (o *Orchestrator) saveMany(ctx context.Context, tx pgx.Tx, ms []*machine, extra []historyRow) error {
	n := 0
	// The sagas that have just ended with wait steps: their events still
	// pending are filed as ignored (no step will consume them).
	var ended []string
	for _, m := range ms {
		if m.changed() {
			n++
			if m.in.EndedAt != nil && m.d != nil && m.d.hasWaits() {
				ended = append(ended, m.in.ID)
			}
		}
	}
	var (
		ids, statuses, phases, steps, stepStates, datas, lastErrors = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		wakeups, deadlines, endeds                                  = make([]*time.Time, 0, n), make([]*time.Time, 0, n), make([]*time.Time, 0, n)
		attempts                                                    = make([]int32, 0, n)
		updated                                                     = make([]time.Time, 0, n)
		hist                                                        = extra
		events                                                      []outbox.Event
	)
	for _, m := range ms {
		hist = append(hist, m.hist...)
		if !m.changed() {
			continue
		}
		in := m.in
		in.NextWakeupAt = m.nextWakeup()
		in.UpdatedAt = m.now
		st, err := encodeSteps(in.Steps)
		if err != nil {
			return fmt.Errorf("saga %s: encode step state: %w", in.ID, err)
		}
		ids, statuses, phases, steps = append(ids, in.ID), append(statuses, string(in.Status)), append(phases, string(in.Phase)), append(steps, in.Step)
		stepStates, datas, lastErrors = append(stepStates, string(st)), append(datas, string(in.Data)), append(lastErrors, oneLine(in.LastError))
		wakeups, deadlines, endeds = append(wakeups, in.NextWakeupAt), append(deadlines, in.DeadlineAt), append(endeds, in.EndedAt)
		attempts, updated = append(attempts, int32(in.Attempts)), append(updated, m.now)
		events = append(events, m.events...)
	}
	// The states, the history and the commands in one round trip: the
	// outbox Writer's statement takes the others with it. In HandleReplies'
	// transaction (pipeline.BeginFunc) all three go out with the COMMIT.
	// saveErr keeps a failure of the first two from reading as the
	// Writer's.
	var before []pipeline.Statement
	var saveErr error
	if n > 0 {
		// The statement itself fails if it saved fewer rows than it was
		// given (the rows are locked in this transaction: only a bug
		// would), so that the COMMIT queued behind it does not run.
		before = append(before, pipeline.Statement{SQL: o.sql.updateMany,
			Args: []any{ids, statuses, phases, steps, stepStates, datas, wakeups, deadlines, attempts, lastErrors, updated, endeds, n},
			Read: func(br pgx.BatchResults) error {
				if _, err := br.Exec(); err != nil {
					saveErr = fmt.Errorf("saga: save %d sagas: %w", n, err)
				}
				return saveErr
			}})
	}
	before = o.appendAttrStatement(before, ms, &saveErr) // attr.go
	if len(hist) > 0 {
		sql, args := o.historyStatement(hist)
		before = append(before, pipeline.Statement{SQL: sql, Args: args, Read: func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				saveErr = fmt.Errorf("saga: write history: %w", err)
			}
			return saveErr
		}})
	}
	if len(ended) > 0 {
		before = append(before, pipeline.Statement{SQL: o.sql.events.closePending, Args: []any{ended}, Read: func(br pgx.BatchResults) error {
			if _, err := br.Exec(); err != nil {
				saveErr = fmt.Errorf("saga: close the pending events of %d ended sagas: %w", len(ended), err)
			}
			return saveErr
		}})
	}
	err := pipeline.WriteLast(ctx, tx, before, fmt.Sprintf("saga: write %d commands", len(events)), func(wtx pgx.Tx) error {
		if len(events) == 0 {
			return nil
		}
		if _, err := o.writer.WriteTx(ctx, wtx, events...); err != nil {
			if saveErr != nil {
				return saveErr
			}
			return fmt.Errorf("saga: write %d commands: %w", len(events), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, m := range ms {
		if m.changed() {
			m.in.Revision++
		}
	}
	return nil
}
