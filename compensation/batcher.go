package compensation

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pipeline"
)

// BatchConfig configures a Batcher.
type BatchConfig struct {
	// MaxBatch is the most commands in one transaction. Defaults to 100.
	MaxBatch int
	// Transactions is the most batch transactions in flight at once.
	// Defaults to 2.
	Transactions int
}

// Batcher runs the commands that concurrent callers hand to its Handle in
// shared transactions (group commit): a caller that finds a transaction
// slot free takes every command waiting, up to MaxBatch, and runs them with
// HandleBatchTx in one transaction; the others wait for the outcome of the
// batch that took theirs. Nothing waits on a timer: under light load each
// command runs alone, under heavy load batches grow while transactions are
// in flight. Handle returns when the command's transaction has committed,
// so the broker is acknowledged only then. A batch holds at most the
// commands in flight at once: with a Router on watermill-kafka, one per
// partition being consumed (its subscriber sends a partition's next message
// after the previous one is acknowledged), so give command topics enough
// partitions for the batches you want.
//
// A batch that fails (a technical error, a malformed command) is run again
// one command per transaction, so that each command gets its own result: a
// core.Permanent error for a malformed one, the technical error for a
// failing one, nil for the others.
//
// A Batcher writes no inbox dedup marks: the barrier already keeps each
// effect to one application, and a redelivered command is answered again
// from the barrier (a second reply to the same attempt, which the
// orchestrator ignores). It is safe for concurrent use; make one per
// command topic, or share one.
type Batcher struct {
	p        *Participant
	maxBatch int
	maxTx    int

	mu      sync.Mutex
	cond    *sync.Cond // signalled when a batch ends
	queue   []*waiter  // commands no batch has taken yet
	running int        // batch transactions in flight
}

type waiter struct {
	msg      *message.Message
	finished bool // under mu
	err      error
}

// NewBatcher returns a Batcher for p's commands.
func (p *Participant) NewBatcher(cfg BatchConfig) (*Batcher, error) {
	if cfg.MaxBatch < 0 || cfg.Transactions < 0 {
		return nil, fmt.Errorf("%w: compensation: BatchConfig values must not be negative", core.ErrConfig)
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 100
	}
	if cfg.Transactions == 0 {
		cfg.Transactions = 2
	}
	b := &Batcher{p: p, maxBatch: cfg.MaxBatch, maxTx: cfg.Transactions}
	b.cond = sync.NewCond(&b.mu)
	return b, nil
}

// Handle runs msg in a batch transaction and returns its result: a
// Watermill NoPublishHandlerFunc. Wire it behind PoisonQueue and Retry, and
// no dedup middleware (AddToRouter does so when RouterConfig.Batch is set).
func (b *Batcher) Handle(msg *message.Message) error {
	w := &waiter{msg: msg}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.queue = append(b.queue, w)
	for !w.finished {
		if b.running < b.maxTx && len(b.queue) > 0 {
			// Lead a batch of whatever waits, ours or not.
			n := min(len(b.queue), b.maxBatch)
			batch := b.queue[:n:n]
			b.queue = b.queue[n:]
			b.running++
			b.mu.Unlock()
			errs := b.run(batch)
			b.mu.Lock()
			for i, bw := range batch {
				bw.finished, bw.err = true, errs[i]
			}
			b.running--
			b.cond.Broadcast()
			continue
		}
		b.cond.Wait()
	}
	return w.err
}

// run handles one batch and returns each command's result.
func (b *Batcher) run(batch []*waiter) []error {
	errs := make([]error, len(batch))
	ctx := context.WithoutCancel(batch[0].msg.Context())
	msgs := make([]*message.Message, len(batch))
	for i, w := range batch {
		msgs[i] = w.msg
	}
	// The last writes of each transaction go out with its COMMIT.
	err := pipeline.BeginFunc(ctx, b.p.pool, func(tx *pipeline.Tx) error { return b.p.HandleBatchTx(ctx, tx, msgs) })
	if err == nil {
		return errs
	}
	var be *core.BatchError
	if len(batch) == 1 && !errors.As(err, &be) {
		errs[0] = err
		return errs
	}
	// One at a time, each in its own transaction, for its own result.
	for i, w := range batch {
		mctx := w.msg.Context()
		errs[i] = pipeline.BeginFunc(mctx, b.p.pool, func(tx *pipeline.Tx) error { return b.p.HandleTx(mctx, tx, w.msg) })
	}
	return errs
}
