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
	"github.com/millrace/millrace/internal/sqlident"
)

// HandlerFunc applies one inbox message. It runs inside tx, which also
// marks the message processed: write the effects with tx (it is also in
// msg.Context(), for the outbox's ContextPublisher). An error rolls back
// what the handler wrote and schedules a retry; an error wrapped with
// core.Permanent dead-letters the message at once.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *message.Message) error

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the inbox, as given to the Receiver. Required.
	Consumer string
	// Handler applies one message. Required.
	Handler HandlerFunc
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

	claim, markDone, markFailed string
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
	table := sqlident.Table(schema, "inbox_event")
	dead, err := NewDeadLetters(pool, DeadLetterConfig{Schema: schema, Consumer: cfg.Consumer})
	if err != nil {
		return nil, err
	}
	p := &Processor{pool: pool, cfg: cfg, dead: dead}
	// The claim walks inbox_event_unprocessed_idx (consumer, id).
	p.claim = fmt.Sprintf(`SELECT id, event_id::text, topic, partition_key, payload, metadata::text, attempts, false
  FROM %s
 WHERE consumer = $1 AND NOT processed AND dead_at IS NULL
   AND (next_attempt_at IS NULL OR next_attempt_at <= now())
 ORDER BY id
 LIMIT $2
   FOR UPDATE SKIP LOCKED`, table)
	if cfg.OrderByKey {
		// The per-key hold is decided twice.
		//
		// Before the LIMIT, so that held rows never fill the batch: a row
		// is skipped when the first unprocessed row of its key (its head)
		// is dead or backing off. The head is the first entry of its key
		// in inbox_event_unprocessed_key_idx (consumer, partition_key, id):
		// one index probe, which the planner caches per key (Memoize), so
		// a long run of held rows costs a scan of
		// inbox_event_unprocessed_idx and little more (measured: 100,000
		// held rows ahead of the batch, ~50 ms).
		//
		// After the claim, exactly: a claimed row is held when the
		// unprocessed row just before it in its key (the last entry before
		// it in the same index, one probe) is not in this batch: it is in
		// another processor's batch (rows stay unprocessed until that batch
		// commits), or waits between the head and this row. The processor
		// then also holds the key's later rows of the batch, so every row
		// it applies has all the earlier rows of its key applied, or
		// applied before it in the same batch.
		p.claim = fmt.Sprintf(`WITH claimed AS (
SELECT q.id, q.event_id::text, q.topic, q.partition_key, q.payload, q.metadata::text, q.attempts
  FROM %[1]s q
  LEFT JOIN LATERAL (
        SELECT h.dead_at, h.next_attempt_at FROM %[1]s h
         WHERE h.consumer = $1 AND h.partition_key = q.partition_key
           AND NOT h.processed AND h.partition_key <> ''
         ORDER BY h.id LIMIT 1) head ON q.partition_key <> ''
 WHERE q.consumer = $1 AND NOT q.processed AND q.dead_at IS NULL
   AND (q.next_attempt_at IS NULL OR q.next_attempt_at <= now())
   AND head.dead_at IS NULL AND (head.next_attempt_at IS NULL OR head.next_attempt_at <= now())
 ORDER BY q.id
 LIMIT $2
   FOR UPDATE OF q SKIP LOCKED
)
SELECT c.*, c.partition_key <> '' AND EXISTS (
        SELECT 1 FROM (SELECT e.id FROM %[1]s e
                        WHERE e.consumer = $1 AND e.partition_key = c.partition_key
                          AND NOT e.processed AND e.partition_key <> '' AND e.id < c.id
                        ORDER BY e.id DESC LIMIT 1) prev
         WHERE prev.id NOT IN (SELECT id FROM claimed))
  FROM claimed c
 ORDER BY c.id`, table)
	}
	p.markDone = fmt.Sprintf(`UPDATE %s SET processed = true, processed_at = now(), next_attempt_at = NULL
 WHERE id = %s`, table, sqlident.AnyParam("$1", "int8"))
	p.markFailed = fmt.Sprintf(`UPDATE %s AS e SET attempts = f.attempts, last_error = f.err,
       next_attempt_at = now() + f.backoff_ms * interval '1 millisecond',
       dead_at = CASE WHEN f.dead THEN now() END
  FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[]) AS f(id, attempts, err, backoff_ms, dead)
 WHERE e.id = f.id`, table)
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
	rows, err := tx.Query(ctx, p.claim, p.cfg.Consumer, p.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("inbox: processor %s: claim: %w", p.cfg.Consumer, err)
	}
	var batch []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.eventID, &r.topic, &r.key, &r.payload, &r.metadata, &r.attempts, &r.held); err != nil {
			rows.Close()
			return 0, fmt.Errorf("inbox: processor %s: claim: %w", p.cfg.Consumer, err)
		}
		batch = append(batch, r)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("inbox: processor %s: claim: %w", p.cfg.Consumer, err)
	}
	if len(batch) == 0 {
		return 0, nil
	}

	var (
		done                  []int64
		failIDs, failAttempts []int64
		failErrs              []string
		failBackoff           []int64
		failDead              []bool
		heldKeys              map[string]bool // keys whose later rows wait
		open                  bool            // a savepoint is open
	)
	for _, r := range batch {
		if r.key != "" && (r.held || heldKeys[r.key]) {
			// An earlier row of its key is waiting, or failed in this
			// batch: hold this one, and the key's later ones, until then.
			if heldKeys == nil {
				heldKeys = map[string]bool{}
			}
			heldKeys[r.key] = true
			continue
		}
		sp := "SAVEPOINT millrace_inbox_row"
		if open {
			sp = "RELEASE SAVEPOINT millrace_inbox_row; " + sp
		}
		if _, err := tx.Exec(ctx, sp); err != nil {
			return 0, fmt.Errorf("inbox: processor %s: savepoint: %w", p.cfg.Consumer, err)
		}
		open = true
		msg, err := r.message(ctx, tx)
		if err == nil {
			err = p.call(ctx, tx, msg)
		}
		if err == nil && tx.Conn().PgConn().TxStatus() == txFailed {
			// The handler swallowed an SQL error: what it wrote is lost
			// and the transaction takes no more statements until it
			// rolls back to the row's savepoint. Charge the row.
			err = errSwallowed
		}
		if err == nil {
			done = append(done, r.id)
			continue
		}
		if ctx.Err() != nil {
			return 0, ctx.Err() // stopping: the batch rolls back, nothing is lost
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT millrace_inbox_row"); rerr != nil {
			return 0, fmt.Errorf("inbox: processor %s: rollback to savepoint after %v: %w", p.cfg.Consumer, err, rerr)
		}
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
		failIDs = append(failIDs, r.id)
		failAttempts = append(failAttempts, int64(attempt))
		failErrs = append(failErrs, err.Error())
		failBackoff = append(failBackoff, backoff.Exponential(attempt, p.cfg.RetryMin, p.cfg.RetryMax).Milliseconds())
		failDead = append(failDead, dead)
		if p.cfg.OrderByKey && r.key != "" {
			if heldKeys == nil {
				heldKeys = map[string]bool{}
			}
			heldKeys[r.key] = true
		}
	}
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, p.markDone, done); err != nil {
			return 0, fmt.Errorf("inbox: processor %s: mark processed: %w", p.cfg.Consumer, err)
		}
	}
	if len(failIDs) > 0 {
		attempts := make([]int32, len(failAttempts))
		for i, a := range failAttempts {
			attempts[i] = int32(a)
		}
		if _, err := tx.Exec(ctx, p.markFailed, failIDs, attempts, failErrs, failBackoff, failDead); err != nil {
			return 0, fmt.Errorf("inbox: processor %s: mark failed: %w", p.cfg.Consumer, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("inbox: processor %s: commit: %w", p.cfg.Consumer, err)
	}
	return len(done) + len(failIDs), nil
}

// txFailed is the transaction status PostgreSQL reports (in ReadyForQuery)
// for a transaction in which a statement failed: it takes no more
// statements until it rolls back (to a savepoint, here).
const txFailed = 'E'

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
