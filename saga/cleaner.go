package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/periodic"
	"github.com/millrace/millrace/internal/sqlident"
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// CompletedAfter is how long a completed saga and its history stay
	// after it ended. Defaults to 7 days.
	CompletedAfter time.Duration
	// CompensatedAfter is how long a compensated saga and its history stay
	// after it ended: a compensation is the outcome someone asks about.
	// Defaults to 30 days.
	CompensatedAfter time.Duration
	// StuckAfter is how long a saga that was stuck at some point (and was
	// then retried, skipped or marked compensated by an operator) stays
	// after it ended, whatever its outcome, when that is longer than its
	// outcome's window. Defaults to 30 days.
	StuckAfter time.Duration
	// BulkAfter is how long a bulk operation (Operator.Bulk) stays, with
	// its record of each saga it selected, after it was created; a request
	// it filed that is applied later still applies, only its outcome is no
	// longer counted. Defaults to 30 days.
	BulkAfter time.Duration
	// BatchSize is the most sagas one statement removes, with their
	// history (and the most records of a bulk operation). Defaults to 500.
	BatchSize int
	// Interval is the time between two passes of Run. Defaults to 1 minute.
	Interval time.Duration
	// Logger receives a line per pass that deleted something, and errors.
	// Defaults to errors to slog.Default().
	Logger watermill.LoggerAdapter
}

// endedStatuses are the statuses the Cleaner removes sagas in. A saga in
// any other status (running, compensating, stuck, or one a later version
// adds) is never removed.
var endedStatuses = []Status{StatusCompleted, StatusCompensated}

// Cleaner is the saga retention job: it removes ended sagas (completed or
// compensated) with their history and stored events once they ended
// longer ago than their outcome's window, in small batches, oldest first.
// It never removes a
// saga in any other status: running, compensating, stuck, or a status it
// does not know. A saga that was ever stuck is kept StuckAfter.
//
// A reply that arrives for a removed saga is recorded as fenced for an
// unknown saga and acknowledged, so the window needs only to outlast the
// time someone may want to look at a saga.
//
// Several Cleaners (one per service instance) may run at once: they skip
// each other's rows. It is safe for concurrent use.
type Cleaner struct {
	pool      *pgxpool.Pool
	windows   map[Status]time.Duration
	stuck     time.Duration
	bulk      time.Duration
	batchSize int
	interval  time.Duration
	logger    watermill.LoggerAdapter
	delete    string
	// deleteBulkItems removes up to $2 records of bulk operations created
	// before $1; deleteBulk then the operations left without any.
	deleteBulkItems, deleteBulk string
	// afterBatch, when set (by tests), sees each batch's count and time.
	afterBatch func(deleted int, took time.Duration)
}

// NewCleaner returns a Cleaner on pool. It does not touch the database.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: saga: NewCleaner: nil pool", core.ErrConfig)
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: saga: CleanerConfig.Schema: %v", core.ErrConfig, err)
	}
	if cfg.CompletedAfter < 0 || cfg.CompensatedAfter < 0 || cfg.StuckAfter < 0 || cfg.BulkAfter < 0 || cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: saga: CleanerConfig: windows, BatchSize and Interval must not be negative", core.ErrConfig)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.CompletedAfter, 7*24*time.Hour)
	def(&cfg.CompensatedAfter, 30*24*time.Hour)
	def(&cfg.StuckAfter, 30*24*time.Hour)
	def(&cfg.BulkAfter, 30*24*time.Hour)
	def(&cfg.Interval, time.Minute)
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 500
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	inst, hist := sqlident.Table(schema, "saga_instance"), sqlident.Table(schema, "saga_history")
	return &Cleaner{
		pool:      pool,
		windows:   map[Status]time.Duration{StatusCompleted: cfg.CompletedAfter, StatusCompensated: cfg.CompensatedAfter},
		stuck:     cfg.StuckAfter,
		bulk:      cfg.BulkAfter,
		batchSize: cfg.BatchSize,
		interval:  cfg.Interval,
		logger:    cfg.Logger.With(watermill.LogFields{"component": "saga.Cleaner", "schema": schema}),
		// One batch, one statement (so one short transaction): up to $6
		// sagas in status $1 that ended before $4, after the point where
		// the previous batch stopped (($2, $3): the sagas before it were
		// removed, or kept for a stuck episode, or locked by another
		// Cleaner), found in order on saga_instance_ended_idx (status,
		// ended_at, id), and locked; then their history
		// (saga_history_saga_idx) and their rows. A saga with a stuck
		// event in its history (found on saga_history_stuck_idx, of
		// migration 012, which holds only those lines) stays
		// unless it also ended before $5. FOR UPDATE checks the status
		// again on a row changed meanwhile. Returns the sagas removed and
		// the last one's (ended_at, id).
		delete: fmt.Sprintf(`WITH old AS (
    SELECT s.id, s.ended_at FROM %[1]s s
     WHERE s.status = $1 AND s.ended_at IS NOT NULL
       AND (s.ended_at, s.id) > ($2::timestamptz, $3::text)
       AND s.ended_at < $4
       AND (s.ended_at < $5
            OR NOT EXISTS (SELECT 1 FROM %[2]s h WHERE h.saga_id = s.id AND (h.event = 'stuck' OR h.status = 'stuck')))
     ORDER BY s.ended_at, s.id
     LIMIT $6
       FOR UPDATE SKIP LOCKED
), h AS (
    DELETE FROM %[2]s WHERE saga_id IN (SELECT id FROM old)
), e AS (
    DELETE FROM %[3]s WHERE saga_id IN (SELECT id FROM old) -- on saga_event_once (saga_id, event_id)
), s AS (
    DELETE FROM %[1]s WHERE id IN (SELECT id FROM old) RETURNING id
), last AS (
    SELECT ended_at, id FROM old ORDER BY ended_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM s), (SELECT ended_at FROM last), coalesce((SELECT id FROM last), '')`, inst, hist, sqlident.Table(schema, "saga_event")),
		// The old operations' records, found on the records' primary key
		// (operation_id, saga_id), a batch at a time; then the operations.
		deleteBulkItems: fmt.Sprintf(`DELETE FROM %[1]s WHERE (operation_id, saga_id) IN (
    SELECT i.operation_id, i.saga_id FROM %[1]s i JOIN %[2]s o ON o.id = i.operation_id
     WHERE o.created_at < $1 LIMIT $2)`, sqlident.Table(schema, "saga_bulk_item"), sqlident.Table(schema, "saga_bulk_operation")),
		deleteBulk: fmt.Sprintf(`DELETE FROM %[2]s o WHERE o.created_at < $1
   AND NOT EXISTS (SELECT 1 FROM %[1]s i WHERE i.operation_id = o.id)`, sqlident.Table(schema, "saga_bulk_item"), sqlident.Table(schema, "saga_bulk_operation")),
	}, nil
}

// Clean removes every saga whose window has passed, with its history, in
// batches of BatchSize, each its own short statement, and returns how many
// sagas it removed; then the bulk operations older than BulkAfter. It
// stops early, with ctx's error, when ctx ends.
func (c *Cleaner) Clean(ctx context.Context) (int, error) {
	var now time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return 0, fmt.Errorf("saga: clean: %w", err)
	}
	stuckCutoff := now.Add(-c.stuck)
	total := 0
	for _, status := range endedStatuses {
		cutoff := now.Add(-c.windows[status])
		from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		fromID := ""
		for {
			start := time.Now()
			var n int
			var last pgtype.Timestamptz
			var lastID string
			if err := c.pool.QueryRow(ctx, c.delete, string(status), from, fromID, cutoff, stuckCutoff, c.batchSize).
				Scan(&n, &last, &lastID); err != nil {
				return total, fmt.Errorf("saga: clean %s sagas: %w", status, err)
			}
			total += n
			if c.afterBatch != nil {
				c.afterBatch(n, time.Since(start))
			}
			if n < c.batchSize || !last.Valid {
				break
			}
			from, fromID = last, lastID
		}
	}
	if err := c.cleanBulk(ctx, now.Add(-c.bulk)); err != nil {
		return total, err
	}
	return total, nil
}

// cleanBulk removes the bulk operations created before cutoff, their
// records first, BatchSize at a time.
func (c *Cleaner) cleanBulk(ctx context.Context, cutoff time.Time) error {
	for {
		tag, err := c.pool.Exec(ctx, c.deleteBulkItems, cutoff, c.batchSize)
		if err != nil {
			return fmt.Errorf("saga: clean bulk operations: %w", err)
		}
		if tag.RowsAffected() < int64(c.batchSize) {
			break
		}
	}
	if _, err := c.pool.Exec(ctx, c.deleteBulk, cutoff); err != nil {
		return fmt.Errorf("saga: clean bulk operations: %w", err)
	}
	return nil
}

// Run cleans every Interval, starting at once, until ctx ends; then it
// returns nil. A failed pass is logged and tried again at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	return periodic.Clean(ctx, c.interval, c.logger, "Saga clean failed", "Sagas cleaned", c.Clean)
}
