package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/periodic"
	"github.com/millrace/millrace/internal/sqlident"
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Retention is how long published and discarded events stay in the
	// log for audit and replay. Defaults to 7 days.
	Retention time.Duration
	// BatchSize is the most rows one DELETE removes. Defaults to 1000.
	BatchSize int
	// Interval is the time between two passes of Run. Defaults to 1 minute.
	Interval time.Duration
	// Logger receives a line per pass that deleted something, and errors.
	// Defaults to DefaultLogger() (errors to slog.Default()).
	Logger watermill.LoggerAdapter
}

// Cleaner is the retention job: it deletes events from the log once they
// were published, or discarded, more than Retention ago. It never deletes
// an event that is pending, dead-lettered or queued for replay. Several
// Cleaners (one per service instance) may run at once: they skip each
// other's rows. It is safe for concurrent use.
type Cleaner struct {
	pool      *pgxpool.Pool
	retention time.Duration
	batchSize int
	interval  time.Duration
	logger    watermill.LoggerAdapter
	delete    string
}

// NewCleaner returns a Cleaner on pool.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, configError("NewCleaner needs a pool")
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, configError("CleanerConfig.Schema: %w", err)
	}
	if cfg.Retention < 0 || cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, configError("CleanerConfig.Retention, BatchSize and Interval must not be negative")
	}
	if cfg.Retention == 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = DefaultLogger()
	}
	c := &Cleaner{
		pool:      pool,
		retention: cfg.Retention,
		batchSize: cfg.BatchSize,
		interval:  cfg.Interval,
		logger:    cfg.Logger.With(watermill.LogFields{"component": "outbox.Cleaner", "schema": schema}),
	}
	// One batch. published_at and discarded_at are never before
	// created_at, so "created_at < cutoff" is implied by the rest: it lets
	// the oldest rows be found on outbox_event_created_at_idx, in order,
	// from the point where the previous batch of the pass stopped ($3), so
	// old rows that must stay (a backlog older than the retention period)
	// are passed over once per pass, not once per batch. SKIP LOCKED leaves
	// rows another Cleaner or a relay holds for the next pass; the pending
	// check keeps events queued for replay.
	c.delete = fmt.Sprintf(`WITH del AS (
    DELETE FROM %[1]s
     WHERE id IN (
        SELECT e.id FROM %[1]s e
         WHERE e.created_at < $1 AND e.created_at >= $3
           AND (e.published_at < $1 OR e.discarded_at < $1)
           AND NOT EXISTS (SELECT 1 FROM %[2]s p WHERE p.id = e.id)
         ORDER BY e.created_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED)
    RETURNING created_at
)
SELECT count(*), max(created_at) FROM del`,
		sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending"))
	return c, nil
}

// CleanOnce deletes every event due for deletion now, in batches of
// BatchSize, each its own short statement, and returns how many it deleted.
// It stops early, with ctx's error, when ctx ends.
func (c *Cleaner) CleanOnce(ctx context.Context) (int64, error) {
	var cutoff time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		c.retention.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: clean: %w", err)
	}
	var from time.Time // the start of the pass: before any created_at
	var total int64
	for {
		var (
			n    int64
			last *time.Time
		)
		if err := c.pool.QueryRow(ctx, c.delete, cutoff, c.batchSize, from).Scan(&n, &last); err != nil {
			return total, fmt.Errorf("outbox: clean: %w", err)
		}
		total += n
		if n < int64(c.batchSize) || last == nil {
			return total, nil
		}
		from = *last
	}
}

// Run cleans every Interval, starting at once, until ctx ends; then it
// returns nil. A failed pass is logged and tried again at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	return periodic.Clean(ctx, c.interval, c.logger, "Outbox clean failed", "Outbox cleaned", c.CleanOnce)
}
