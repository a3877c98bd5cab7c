package compensation

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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
	// Window is how long a saga's barrier rows stay after the last command
	// of that saga reached this participant. It must outlast the longest
	// time a command of the saga can still arrive (see Cleaner). Defaults
	// to 7 days.
	Window time.Duration
	// BatchSize is the most sagas one DELETE removes the rows of.
	// Defaults to 1000.
	BatchSize int
	// Interval is the time between two passes of Run. Defaults to 1 minute.
	Interval time.Duration
	// Logger receives a line per pass that deleted something, and errors.
	// Defaults to errors to slog.Default() (outbox.DefaultLogger).
	Logger watermill.LoggerAdapter
}

// Cleaner removes the barrier rows of sagas that ended, in small batches.
//
// A participant is not told when a saga ends, so the Cleaner takes a saga
// as ended when none of its barrier rows was written or reached by a
// command (a duplicate, a late action, a failed compensation) for Window.
// It removes a saga's rows together, never the action's row without its
// compensation's, so a pass never leaves a barrier that decides wrongly.
//
// The window must outlast the longest time after which a command of a saga
// can still arrive: the saga's deadline plus the time an operator may take
// to retry a stuck saga, the broker's retention if consumers may rewind,
// outbox replays, the longest outage after which old messages are still
// delivered. A command that arrives after its saga's rows were removed
// meets an empty barrier: a duplicate action runs a second time, a late
// action runs after its compensation (its effect is then never undone), and
// a compensation of an action that ran is taken for an empty one (the
// effect stays). The inbox's dedup marks need the same care (see the inbox
// Cleaner).
//
// Several Cleaners (one per service instance) may run at once: they skip
// each other's rows. It is safe for concurrent use.
type Cleaner struct {
	pool      *pgxpool.Pool
	window    time.Duration
	batchSize int
	interval  time.Duration
	logger    watermill.LoggerAdapter
	delete    string
}

// NewCleaner returns a Cleaner. It does not touch the database.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: compensation: nil pool", core.ErrConfig)
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: compensation: %v", core.ErrConfig, err)
	}
	if cfg.Window < 0 || cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: compensation: CleanerConfig: Window, BatchSize and Interval must not be negative", core.ErrConfig)
	}
	if cfg.Window == 0 {
		cfg.Window = 7 * 24 * time.Hour
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	t := sqlident.Table(schema, "compensation_barrier")
	return &Cleaner{
		pool:      pool,
		window:    cfg.Window,
		batchSize: cfg.BatchSize,
		interval:  cfg.Interval,
		logger:    cfg.Logger.With(watermill.LogFields{"component": "compensation.Cleaner", "schema": schema}),
		// One batch: up to $2 old rows (compensation_barrier_updated_at_idx,
		// BRIN) whose saga has no row reached since the cutoff (the primary
		// key's saga_id prefix), then every row of those sagas. The DELETE
		// checks updated_at again: a row a command reached meanwhile stays.
		// Returns the rows found and the rows deleted.
		delete: fmt.Sprintf(`WITH old AS (
    SELECT o.saga_id FROM %[1]s o
     WHERE o.updated_at < $1
       AND NOT EXISTS (SELECT 1 FROM %[1]s n WHERE n.saga_id = o.saga_id AND n.updated_at >= $1)
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), del AS (
    DELETE FROM %[1]s b WHERE b.saga_id IN (SELECT saga_id FROM old) AND b.updated_at < $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM del)`, t),
	}, nil
}

// CleanOnce removes the rows of every saga ended more than Window ago, in
// batches, each its own short statement, and returns how many rows it
// removed. It stops early, with ctx's error, when ctx ends.
func (c *Cleaner) CleanOnce(ctx context.Context) (int64, error) {
	var cutoff time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		c.window.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("compensation: clean: %w", err)
	}
	var total int64
	for {
		var found, deleted int64
		if err := c.pool.QueryRow(ctx, c.delete, cutoff, c.batchSize).Scan(&found, &deleted); err != nil {
			return total, fmt.Errorf("compensation: clean: %w", err)
		}
		total += deleted
		if found < int64(c.batchSize) {
			return total, nil
		}
	}
}

// Run cleans every Interval, starting at once, until ctx ends; then it
// returns nil. A failed pass is logged and tried again at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	return periodic.Clean(ctx, c.interval, c.logger, "Barrier clean failed", "Barrier cleaned", c.CleanOnce)
}
