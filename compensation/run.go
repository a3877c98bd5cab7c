package compensation

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/backoff"
	"github.com/millrace/millrace/internal/fetch"
	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/internal/poison"
)

// RunConfig configures RunBatched.
type RunConfig struct {
	// Subscriber reads Topic. Required. When it is also a
	// kafka.BatchSubscriber (kafka.Subscriber is), the commands are read
	// whole fetches at a time.
	Subscriber message.Subscriber
	// Topic is the command topic. Required.
	Topic string
	// Poison receives the malformed commands and those without a usable
	// event id, with the reason in metadata "reason_poisoned". Required.
	Poison message.Publisher
	// PoisonTopic is the topic of Poison. Defaults to Topic + ".poison".
	PoisonTopic string
	// MaxBatch is the most commands in one transaction. Defaults to 500.
	MaxBatch int
	// Workers is the number of batch transactions in flight at once.
	// Defaults to 1: while a batch's transaction runs, the next batch
	// gathers what arrives, so batches grow with the load. More workers
	// help when a batch waits on something other than this machine's CPU:
	// handlers that wait on I/O, round trips to a distant database (see
	// saga.BatchConfig.Workers for what one worker gave on two cores).
	Workers int
	// OnBatch, when set, is called with the size of each batch
	// transaction, before it runs (for metrics). Defaults to nil.
	OnBatch func(n int)
}

// RunBatched consumes cfg.Topic and handles its commands many per
// transaction until ctx ends: the inbox dedup marks of a batch in one
// statement (Deduplicator.MarkTx, consumer: the participant's name), then
// HandleBatchTx for the commands not seen before, in the same transaction.
// With a kafka.BatchSubscriber, a batch is what the partitions have
// fetched, up to MaxBatch, closed as soon as nothing more is ready; with
// another subscriber, the messages it has delivered and that are ready.
// Order per saga holds because commands are keyed by saga id (one
// partition, one batch in flight per partition).
//
// A malformed command or one without a usable event id is taken out of
// its batch before anything is written and published to the poison topic.
// A batch that fails otherwise rolls back whole and is run again one
// command per transaction: a command that fails alone is nacked (from a
// kafka.BatchSubscriber, with the commands after it in its partition,
// which come again in order) and the others acknowledged.
func (p *Participant) RunBatched(ctx context.Context, cfg RunConfig) error {
	switch {
	case cfg.Subscriber == nil || cfg.Poison == nil:
		return fmt.Errorf("%w: compensation: RunConfig.Subscriber and Poison are required", millrace.ErrConfig)
	case cfg.Topic == "":
		return fmt.Errorf("%w: compensation: RunConfig.Topic is required", millrace.ErrConfig)
	case cfg.MaxBatch < 0 || cfg.Workers < 0:
		return fmt.Errorf("%w: compensation: RunConfig values must not be negative", millrace.ErrConfig)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 500
	}
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.PoisonTopic == "" {
		cfg.PoisonTopic = cfg.Topic + ".poison"
	}
	poisonPub := poison.Publisher(cfg.Poison, p.logger, func(*message.Message) { p.metrics.poisoned(p.name) })
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, _, waitSubs, err := fetch.Subscribe(ctx, cfg.Subscriber, []string{cfg.Topic})
	if err != nil {
		return fmt.Errorf("compensation: %s: %w", p.name, err)
	}
	// settle acknowledges a handled command, once its poison copy (for a
	// malformed one) is published.
	settle := func(msg *message.Message, perr error) {
		if perr != nil {
			c := msg.Copy()
			c.Metadata.Set(middleware.ReasonForPoisonedKey, perr.Error())
			c.Metadata.Set(middleware.PoisonedTopicKey, cfg.Topic)
			if err := poisonPub.Publish(cfg.PoisonTopic, c); err != nil {
				p.logger.Error("compensation: poison a malformed command", err, map[string]any{"message": msg.UUID})
				msg.Nack()
				return
			}
		}
		msg.Ack()
	}
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := &fetch.Gatherer{In: in, Max: cfg.MaxBatch}
			failures := 0
			for {
				runs := g.Next(ctx)
				if runs == nil {
					return
				}
				msgs := fetch.Messages(runs)
				if cfg.OnBatch != nil {
					cfg.OnBatch(len(msgs))
				}
				bad, err := p.runBatch(ctx, msgs)
				if err == nil {
					failures = 0
					for _, m := range msgs {
						settle(m, bad[m.UUID])
					}
					continue
				}
				if ctx.Err() == nil {
					p.logger.Error("compensation: command batch", err, map[string]any{"commands": len(msgs)})
				}
				if len(msgs) > 1 {
					applied := g.EachAlone(ctx, runs, func(_ string, m *message.Message) bool {
						bad, err := p.runBatch(ctx, []*message.Message{m})
						if err != nil {
							if ctx.Err() == nil {
								p.logger.Error("compensation: command", err, map[string]any{"message": m.UUID})
							}
							return false
						}
						settle(m, bad[m.UUID])
						return true
					})
					if applied > 0 {
						failures = 0
						continue
					}
				} else {
					g.NackAll(runs)
				}
				failures++
				backoff.Sleep(ctx, backoff.Exponential(failures, 10*time.Millisecond, time.Second))
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	waitSubs()
	return nil
}

// runBatch handles msgs in one transaction: marks, then HandleBatchTx for
// the new ones. It returns the permanent errors of the messages it took
// out (by UUID); any error means nothing was applied.
func (p *Participant) runBatch(ctx context.Context, msgs []*message.Message) (map[string]error, error) {
	bad := map[string]error{}
	todo := make([]*message.Message, 0, len(msgs))
	for _, m := range msgs {
		if _, err := p.item(m); err != nil {
			bad[m.UUID] = err
			continue
		}
		todo = append(todo, m)
	}
	if len(todo) == 1 {
		// One command (most batches at a low rate): its mark goes in the
		// round trip of BEGIN, and its last writes with the COMMIT.
		m := todo[0]
		err := pipeline.BeginWith(ctx, p.pool, func(ctx context.Context, c *pgx.Conn) (pgx.Tx, error) {
			tx, _, err := p.dedup.BeginMarked(ctx, c, m) // a duplicate: no tx, nothing to do
			if errors.Is(err, inbox.ErrNoEventID) {
				bad[m.UUID] = err
				return nil, nil
			}
			return tx, err
		}, func(tx *pipeline.Tx) error { return p.HandleBatchTx(ctx, tx, todo) })
		if err != nil {
			return nil, err
		}
		return bad, nil
	}
	// HandleBatchTx leaves its last writes queued: they go out with the
	// COMMIT, in one round trip.
	err := pipeline.BeginFunc(ctx, p.pool, func(tx *pipeline.Tx) error {
		var fresh []bool
		for {
			var err error
			fresh, err = p.dedup.MarkTx(ctx, tx, todo...)
			var be *millrace.BatchError
			if !errors.As(err, &be) {
				if err != nil {
					return err
				}
				break
			}
			// tx is untouched: take the named ones out and mark the rest.
			for _, e := range be.Errors {
				bad[e.UUID] = e.Err
			}
			todo = withoutBad(todo, bad)
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
		return p.HandleBatchTx(ctx, tx, run)
	})
	if err != nil {
		return nil, err
	}
	return bad, nil
}

func withoutBad(msgs []*message.Message, bad map[string]error) []*message.Message {
	out := msgs[:0:0]
	for _, m := range msgs {
		if bad[m.UUID] == nil {
			out = append(out, m)
		}
	}
	return out
}
