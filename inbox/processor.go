package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/backoff"
	"github.com/millrace/millrace/internal/logging"
)

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the inbox, as given to the Receiver. Required.
	Consumer string
	// Handler applies one message. Required. It runs inside tx, which
	// also marks the message processed: write the effects with tx (it is
	// also in msg.Context(), for the outbox's ContextPublisher). An error
	// rolls back what the handler wrote and schedules a retry; an error
	// wrapped with core.Permanent dead-letters the message at once.
	Handler func(ctx context.Context, tx pgx.Tx, msg *message.Message) error
	// BatchSize is the number of rows claimed per transaction.
	// Defaults to 100.
	BatchSize int
	// PollInterval is how long Run waits after a batch that was not full
	// before it looks again. Defaults to 100ms.
	PollInterval time.Duration
	// Workers is the number of claim loops Run runs at once. Defaults to 1.
	Workers int
	// MaxAttempts is the number of failed attempts after which a message is
	// dead-lettered. Defaults to 10.
	MaxAttempts int
	// RetryMin and RetryMax bound the capped exponential backoff between
	// attempts (the names the outbox Relay uses): the wait after the first
	// failure is RetryMin, and it doubles with each further failure up to
	// RetryMax. Default to 1s and 5 minutes.
	RetryMin, RetryMax time.Duration
	// OrderByKey processes rows with the same non-empty partition key in
	// arrival order, also with several processors: a key whose earlier row
	// waits (failed and backing off, dead, or in another processor's batch)
	// holds its later rows, and only them: other keys flow past it.
	// Defaults to false (any order).
	OrderByKey bool
	// OnError, when set, is called for every handler failure (for
	// metrics). Defaults to nil.
	OnError func(msg *message.Message, attempt int, err error)
	// Logger receives handler failures, dead letters and failed batches
	// (the database unavailable, say). Defaults to errors to
	// slog.Default() (outbox.DefaultLogger).
	Logger watermill.LoggerAdapter
}

// Processor applies the messages a Receiver stored, at its own pace. Each
// batch is one transaction: it claims up to BatchSize unprocessed rows with
// FOR UPDATE SKIP LOCKED (so several processors, in one process or many,
// never apply a row twice), runs the handler for each row under a
// savepoint, and marks the rows processed or failed, then commits once.
//
// Why a savepoint per row rather than a transaction per row: a failing row
// rolls back only its own writes, while the batch pays one commit (one WAL
// flush) instead of one per row; the savepoint costs one round trip, merged
// with the release of the previous one. A crash mid-batch rolls the whole
// batch back and it is claimed again: nothing is applied twice. A handler
// that returns nil after an SQL error of its own (the transaction is then
// aborted) is caught: its row rolls back to the savepoint and is charged
// an attempt, and the batch goes on.
//
// It is safe for concurrent use.
type Processor struct {
	pool *pgxpool.Pool
	cfg  ProcessorConfig
	dead *DeadLetters

	sql processorSQL
}

// NewProcessor returns a Processor. It does not touch the database.
func NewProcessor(pool *pgxpool.Pool, cfg ProcessorConfig) (*Processor, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", core.ErrConfig)
	}
	schema, err := configSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := checkConsumer("ProcessorConfig.Consumer", cfg.Consumer); err != nil {
		return nil, err
	}
	switch {
	case cfg.Handler == nil:
		return nil, fmt.Errorf("%w: ProcessorConfig.Handler is required", core.ErrConfig)
	case cfg.BatchSize < 0 || cfg.Workers < 0 || cfg.MaxAttempts < 0 || cfg.PollInterval < 0 || cfg.RetryMin < 0 || cfg.RetryMax < 0:
		return nil, fmt.Errorf("%w: negative ProcessorConfig value", core.ErrConfig)
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 100
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	cfg.Logger = cfg.Logger.With(watermill.LogFields{"component": "inbox.Processor", "consumer": cfg.Consumer})
	if cfg.Workers == 0 {
		cfg.Workers = 1
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin = time.Second
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = 5 * time.Minute
	}
	if cfg.RetryMax < cfg.RetryMin {
		return nil, fmt.Errorf("%w: ProcessorConfig.RetryMax %v < RetryMin %v", core.ErrConfig, cfg.RetryMax, cfg.RetryMin)
	}
	dead, err := NewDeadLetters(pool, DeadLetterConfig{Schema: schema, Consumer: cfg.Consumer})
	if err != nil {
		return nil, err
	}
	p := &Processor{pool: pool, cfg: cfg, dead: dead, sql: newProcessorSQL(schema, cfg.OrderByKey)}
	return p, nil
}

// DeadLetters returns the dead-letter API for this Processor's consumer.
func (p *Processor) DeadLetters() *DeadLetters { return p.dead }

// Run processes batches until ctx ends, then returns nil. A database error
// is retried after PollInterval; Run never gives up on its own.
func (p *Processor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Go(func() { p.loop(ctx) })
	}
	wg.Wait()
	return nil
}

func (p *Processor) loop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		n, err := p.ProcessOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			p.cfg.Logger.Error("Inbox batch failed; retrying", err, watermill.LogFields{"retry_in": p.cfg.PollInterval.String()})
		}
		if err == nil && n >= p.cfg.BatchSize {
			timer.Reset(0) // more is waiting
		} else {
			timer.Reset(p.cfg.PollInterval)
		}
	}
}

type row struct {
	id             int64
	eventID, topic string
	key            string
	payload        []byte
	metadata       string
	attempts       int
	held           bool // an earlier row of its key is not in this batch
}

// ProcessOnce claims and applies one batch, and returns the number of rows
// it processed or failed (rows held back behind an earlier row of their
// key are not counted). Run calls it in a loop; call it yourself to drive
// the processor from your own scheduler.
func (p *Processor) ProcessOnce(ctx context.Context) (int, error) {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: processor %s: begin: %w", p.cfg.Consumer, err)
	}
	defer rollback(ctx, tx)
	batch, err := p.claimBatch(ctx, tx)
	if err != nil || len(batch) == 0 {
		return 0, err
	}
	var out outcomes
	for _, r := range batch {
		if r.key != "" && (r.held || out.heldKeys[r.key]) {
			// An earlier row of its key is waiting, or failed in this
			// batch: hold this one, and the key's later ones, until then.
			out.holdKey(r.key)
			continue
		}
		if err := p.apply(ctx, tx, r, &out); err != nil {
			if errors.Is(err, errConnBusy) {
				// The batch is lost with its connection: charge the row
				// on its own; the others are claimed again.
				return 1, p.chargeAlone(ctx, r, out.failed)
			}
			return 0, err
		}
	}
	if err := p.record(ctx, tx, &out); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("inbox: processor %s: commit: %w", p.cfg.Consumer, err)
	}
	return len(out.done) + len(out.failed.ids), nil
}

// claimBatch claims the rows of a batch, in id order.
func (p *Processor) claimBatch(ctx context.Context, tx pgx.Tx) ([]row, error) {
	rows, err := tx.Query(ctx, p.sql.claim, p.cfg.Consumer, p.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("inbox: processor %s: claim: %w", p.cfg.Consumer, err)
	}
	batch, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (row, error) {
		var r row
		err := cr.Scan(&r.id, &r.eventID, &r.topic, &r.key, &r.payload, &r.metadata, &r.attempts, &r.held)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("inbox: processor %s: claim: %w", p.cfg.Consumer, err)
	}
	return batch, nil
}

// outcomes are what became of a batch's rows.
type outcomes struct {
	done     []int64
	failed   failures
	heldKeys map[string]bool // keys whose later rows wait
	open     bool            // a savepoint is open
}

func (o *outcomes) holdKey(key string) {
	if o.heldKeys == nil {
		o.heldKeys = map[string]bool{}
	}
	o.heldKeys[key] = true
}

// failures are the failed rows of a batch, as columns for markFailed.
type failures struct {
	ids      []int64
	attempts []int32
	errs     []string
	backoff  []int64 // milliseconds
	dead     []bool
}

// apply runs the handler for r under a savepoint, and records in out what
// became of it. An error is the batch's: it rolls back.
func (p *Processor) apply(ctx context.Context, tx pgx.Tx, r row, out *outcomes) error {
	sp := "SAVEPOINT millrace_inbox_row"
	if out.open {
		sp = "RELEASE SAVEPOINT millrace_inbox_row; " + sp
	}
	if _, err := tx.Exec(ctx, sp); err != nil {
		return fmt.Errorf("inbox: processor %s: savepoint: %w", p.cfg.Consumer, err)
	}
	out.open = true
	msg, err := r.message(ctx, tx)
	if err == nil {
		err = p.call(ctx, tx, msg)
	}
	if tx.Conn().PgConn().IsBusy() {
		// The handler left a result set open (it panicked while reading
		// rows, or did not close them): the connection takes no other
		// statement, its rollback to the savepoint neither. Close it (the
		// batch rolls back) and charge the row alone.
		if err == nil {
			err = errLeftOpen
		}
		_ = tx.Conn().Close(context.WithoutCancel(ctx))
		p.fail(r, msg, err, out)
		return errConnBusy
	}
	if err == nil && tx.Conn().PgConn().TxStatus() == txFailed {
		// The handler swallowed an SQL error: what it wrote is lost
		// and the transaction takes no more statements until it
		// rolls back to the row's savepoint. Charge the row.
		err = errSwallowed
	}
	if err == nil {
		out.done = append(out.done, r.id)
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err() // stopping: the batch rolls back, nothing is lost
	}
	if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT millrace_inbox_row"); rerr != nil {
		return fmt.Errorf("inbox: processor %s: rollback to savepoint after %v: %w", p.cfg.Consumer, err, rerr)
	}
	p.fail(r, msg, err, out)
	return nil
}

// fail records the failure of row r (its message msg, nil if it could not
// be built): an attempt charged, dead-lettered after MaxAttempts or at
// once when permanent, and with OrderByKey its key's later rows held.
func (p *Processor) fail(r row, msg *message.Message, err error, out *outcomes) {
	attempt := r.attempts + 1
	if p.cfg.OnError != nil && msg != nil {
		p.cfg.OnError(msg, attempt, err)
	}
	dead := attempt >= p.cfg.MaxAttempts || core.IsPermanent(err)
	fields := watermill.LogFields{"event_id": r.eventID, "attempt": attempt}
	if dead {
		p.cfg.Logger.Error("Inbox message dead-lettered", err, fields)
	} else {
		p.cfg.Logger.Info("Inbox message failed; will retry: "+err.Error(), fields)
	}
	f := &out.failed
	f.ids = append(f.ids, r.id)
	f.attempts = append(f.attempts, int32(attempt))
	f.errs = append(f.errs, err.Error())
	f.backoff = append(f.backoff, backoff.Exponential(attempt, p.cfg.RetryMin, p.cfg.RetryMax).Milliseconds())
	f.dead = append(f.dead, dead)
	if p.cfg.OrderByKey && r.key != "" {
		out.holdKey(r.key)
	}
}

// chargeAlone records the failure of row r (in f, as fail put it), in a
// transaction of its own, after the batch's was lost with its connection.
// The row is charged only if nothing else changed it since the claim
// (markFailed checks its attempts).
func (p *Processor) chargeAlone(ctx context.Context, r row, f failures) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("inbox: processor %s: begin: %w", p.cfg.Consumer, err)
	}
	defer rollback(ctx, tx)
	last := len(f.ids) - 1
	one := &outcomes{failed: failures{ids: f.ids[last:], attempts: f.attempts[last:], errs: f.errs[last:], backoff: f.backoff[last:], dead: f.dead[last:]}}
	if err := p.record(ctx, tx, one); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("inbox: processor %s: commit: %w", p.cfg.Consumer, err)
	}
	return nil
}

// record marks the batch's rows processed or failed.
func (p *Processor) record(ctx context.Context, tx pgx.Tx, out *outcomes) error {
	if len(out.done) > 0 {
		if _, err := tx.Exec(ctx, p.sql.markDone, out.done); err != nil {
			return fmt.Errorf("inbox: processor %s: mark processed: %w", p.cfg.Consumer, err)
		}
	}
	if f := out.failed; len(f.ids) > 0 {
		if _, err := tx.Exec(ctx, p.sql.markFailed, f.ids, f.attempts, f.errs, f.backoff, f.dead); err != nil {
			return fmt.Errorf("inbox: processor %s: mark failed: %w", p.cfg.Consumer, err)
		}
	}
	return nil
}

// txFailed is the transaction status PostgreSQL reports (in ReadyForQuery)
// for a transaction in which a statement failed: it takes no more
// statements until it rolls back (to a savepoint, here).
const txFailed = 'E'

// errLeftOpen is a row's error when its handler returned nil but left a
// result set open; errConnBusy ends a batch whose connection such a handler
// left busy.
var (
	errLeftOpen = errors.New("inbox: the handler returned with a result set open (rows not closed): the batch's connection could take no other statement")
	errConnBusy = errors.New("inbox: the batch's connection is busy with a result set the handler left open")
)

// errSwallowed is a row's error when its handler returned nil but left the
// transaction failed.
var errSwallowed = errors.New("inbox: the handler returned nil but an SQL statement in it failed (current transaction is aborted): a swallowed error; its writes were rolled back")

// call runs the handler, turning a panic into an error.
func (p *Processor) call(ctx context.Context, tx pgx.Tx, msg *message.Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inbox: handler panicked: %v", r)
		}
	}()
	return p.cfg.Handler(msg.Context(), tx, msg)
}

// message rebuilds the Watermill message of a row. Its UUID is the event id.
func (r row) message(ctx context.Context, tx pgx.Tx) (*message.Message, error) {
	msg := message.NewMessage(r.eventID, r.payload)
	if r.metadata != "" && r.metadata != "{}" {
		if err := json.Unmarshal([]byte(r.metadata), &msg.Metadata); err != nil {
			return nil, core.Permanent(fmt.Errorf("inbox: event %s: metadata: %w", r.eventID, err))
		}
	}
	msg.SetContext(core.ContextWithTx(ctx, tx))
	return msg, nil
}
