package compensation

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/dedupmark"
	"github.com/millrace/millrace/internal/fetch"
	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/internal/poison"
)

// RunConfig configures RunBatched.
type RunConfig struct {
	// Subscriber reads Topic. Required. When it is also a
	// core.BatchSubscriber (kafka.Subscriber is), the commands are read
	// whole fetches at a time; from another, a batch takes what has
	// arrived within core.DefaultBatchWait of its first command.
	Subscriber message.Subscriber
	// Topic is the command topic. Required.
	Topic string
	// Poison receives the malformed commands and those without a usable
	// event id, with the reason in metadata "reason_poisoned". Required.
	Poison message.Publisher
	// PoisonTopic is the topic of Poison. Defaults to Topic + ".poison".
	PoisonTopic string
	// BatchSize is the most commands in one transaction. Defaults to
	// core.DefaultBatchSize.
	BatchSize int
	// Workers is the number of batch transactions in flight at once.
	// Defaults to 1: while a batch's transaction runs, the next batch
	// gathers what arrives, so batches grow with the load. More workers
	// help when a batch waits on something other than this machine's CPU:
	// handlers that wait on I/O, round trips to a distant database (see
	// saga.BatchConfig.Workers for what one worker gave on two cores).
	Workers int
}

// RunBatched consumes cfg.Topic and handles its commands many per
// transaction until ctx ends: the inbox dedup marks of a batch in one
// statement (consumer: the participant's name), then HandleTx for the
// commands not seen before, in the same transaction. The marks go in the
// round trip of BEGIN and the barrier claims, in a form that fails on a
// command applied before; a batch that holds one is rolled back and marked
// again with Deduplicator.MarkTx, so that only its new commands run.
// With a core.BatchSubscriber, a batch is what the partitions have
// fetched, up to MaxBatch, closed as soon as nothing more is ready; with
// another subscriber, the messages it has delivered and that are ready.
// Order per saga holds because commands are keyed by saga id (one
// partition, one batch in flight per partition).
//
// A malformed command or one without a usable event id is taken out of
// its batch and published to the poison topic; one whose saga headers and
// reply topic are usable (an unknown command, a payload that does not
// decode) is answered in the batch first, with a failure whose reason
// begins "poisoned: " (see the package documentation).
// A batch that fails otherwise rolls back whole and is run again one
// command per transaction: a command that fails alone is nacked (from a
// core.BatchSubscriber, with the commands after it in its partition,
// which come again in order) and the others acknowledged.
func (p *Participant) RunBatched(ctx context.Context, cfg RunConfig) error {
	switch {
	case cfg.Subscriber == nil || cfg.Poison == nil:
		return fmt.Errorf("%w: compensation: RunConfig.Subscriber and Poison are required", core.ErrConfig)
	case cfg.Topic == "":
		return fmt.Errorf("%w: compensation: RunConfig.Topic is required", core.ErrConfig)
	case cfg.BatchSize < 0 || cfg.Workers < 0:
		return fmt.Errorf("%w: compensation: RunConfig values must not be negative", core.ErrConfig)
	}
	p.mu.RLock()
	none := len(p.commands) == 0
	p.mu.RUnlock()
	if none {
		return fmt.Errorf("%w: compensation: %s: no command is registered (compensation.Register)", core.ErrConfig, p.name)
	}
	c := fetch.Consumer{What: "compensation: " + p.name + ": command", Max: cmp.Or(cfg.BatchSize, core.DefaultBatchSize),
		Wait: core.DefaultBatchWait, Workers: cmp.Or(cfg.Workers, 1), PoisonTopic: cfg.PoisonTopic, Logger: p.logger,
		Poison:  poison.Publisher(cfg.Poison, p.logger, func(*message.Message) { p.metrics.poisoned(p.name) }),
		OnBatch: func(n int) { p.metrics.batch(p.name, n) }}
	return c.Run(ctx, cfg.Subscriber, []string{cfg.Topic}, func(ctx context.Context, msgs []*message.Message) ([]error, error) {
		bad, err := p.runBatch(ctx, msgs)
		if err != nil {
			return nil, err
		}
		poisoned := make([]error, len(msgs))
		for i, m := range msgs {
			poisoned[i] = bad[m.UUID]
		}
		return poisoned, nil
	})
}

// runBatch handles msgs in one transaction: marks, then HandleTx for
// the new ones. It returns the permanent errors of the messages it took
// out (by UUID); any error means nothing was applied.
//
// Duplicates are rare (a redelivery after a crash or a rebalance), so the
// marks go first in their strict form (internal/dedupmark), in the round
// trip of BEGIN and the barrier claims: a batch costs a round trip less
// than marking first and reading the answer. A duplicate fails that round
// trip and the transaction rolls back: a batch of one was applied before,
// nothing to do; a bigger batch is marked again the careful way (MarkTx),
// and only its new commands are handled.
func (p *Participant) runBatch(ctx context.Context, msgs []*message.Message) (map[string]error, error) {
	bad := map[string]error{}
	todo := make([]*message.Message, 0, len(msgs))
	for _, m := range msgs {
		it, err := p.item(m)
		if err != nil {
			bad[m.UUID] = err
			if it == nil {
				continue
			}
			// Poisoned, but it can be answered: it is, in this batch
			// (with its mark), and poisoned after.
		}
		todo = append(todo, m)
	}
	var (
		mark pipeline.Statement
		err  error
	)
	for {
		mark.SQL, mark.Args, err = dedupmark.Strict(p.dedup, todo)
		var be *core.BatchError
		if !errors.As(err, &be) {
			break
		}
		// Take the named ones out and mark the rest.
		named := map[string]error{}
		for _, e := range be.Errors {
			bad[e.UUID], named[e.UUID] = e.Err, e.Err
		}
		todo = withoutBad(todo, named)
	}
	if err != nil {
		return nil, err
	}
	if len(todo) == 0 {
		return bad, nil
	}
	mark.Read = func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if dedupmark.IsDuplicate(err) {
			return errMarkedBefore
		}
		if err != nil {
			return fmt.Errorf("compensation: %s: record %d marks: %w", p.name, len(todo), err)
		}
		return nil
	}
	// HandleTx's first statement (the claims) carries BEGIN and the
	// marks; its last writes go out with the COMMIT.
	err = pipeline.BeginFunc(ctx, p.pool, func(tx *pipeline.Tx) error {
		tx.Before = append(tx.Before, mark)
		return p.handleTx(ctx, tx, true, todo)
	})
	switch {
	case err == nil:
		return bad, nil
	case !errors.Is(err, errMarkedBefore):
		return nil, err
	case len(todo) == 1:
		return bad, nil // applied before
	}
	err = pipeline.BeginFunc(ctx, p.pool, func(tx *pipeline.Tx) error {
		fresh, err := p.dedup.MarkTx(ctx, tx, todo...)
		if err != nil {
			return err
		}
		run := todo[:0:0]
		for i, m := range todo {
			if fresh[i] {
				run = append(run, m)
			}
		}
		if len(run) == 0 {
			return nil
		}
		return p.handleTx(ctx, tx, true, run)
	})
	if err != nil {
		return nil, err
	}
	return bad, nil
}

// errMarkedBefore says a strict mark of runBatch found an event id
// recorded before.
var errMarkedBefore = errors.New("compensation: a command of the batch was applied before")

func withoutBad(msgs []*message.Message, bad map[string]error) []*message.Message {
	out := msgs[:0:0]
	for _, m := range msgs {
		if bad[m.UUID] == nil {
			out = append(out, m)
		}
	}
	return out
}
