package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/periodic"
	"github.com/millrace/millrace/internal/pgprobe"
	"github.com/millrace/millrace/internal/sqlident"
)

// The windows and the interval a zero Config field stands for.
const (
	DefaultEvents      = 7 * 24 * time.Hour  // Config.Events: 7 days
	DefaultMarks       = 7 * 24 * time.Hour  // Config.Marks: 7 days
	DefaultBarrier     = 7 * 24 * time.Hour  // Config.Barrier: 7 days
	DefaultCompleted   = 7 * 24 * time.Hour  // Config.Completed: 7 days
	DefaultCompensated = 30 * 24 * time.Hour // Config.Compensated: 30 days
	DefaultAudit       = 90 * 24 * time.Hour // Config.Audit: 90 days
	DefaultInterval    = time.Minute         // Config.Interval: 1 minute
)

// The most rows (or sagas) one statement removes, per kind.
const (
	eventBatch   = 1000 // events
	markBatch    = 1000 // dedup marks, and processed inbox rows
	barrierBatch = 1000 // old barrier rows, whose sagas' rows go
	sagaBatch    = 500  // sagas with their history, and bulk operation records
	auditBatch   = 1000 // audit trail entries
)

// Config says what a Cleaner removes from one schema, and how.
type Config struct {
	// Schema holds millrace's tables. Required; already validated by the
	// caller (it is checked again).
	Schema string
	// The windows: how long each kind of row stays after it ended (the
	// package doc says what each must outlast).

	// Events is how long an outbox event stays after it was published or
	// discarded. Defaults to DefaultEvents (7 days).
	Events time.Duration
	// Marks is how long an inbox dedup mark, and a processed inbox row,
	// stays after it was processed. Defaults to DefaultMarks (7 days).
	Marks time.Duration
	// Barrier is how long a saga's barrier rows stay after the last command
	// of that saga reached the participant. Defaults to DefaultBarrier (7
	// days).
	Barrier time.Duration
	// Completed is how long a completed saga and its history stay after it
	// ended. Defaults to DefaultCompleted (7 days).
	Completed time.Duration
	// Compensated is how long a compensated saga and its history stay after
	// it ended; also a saga that was ever stuck (whatever its outcome, when
	// that is longer than its outcome's window), and a bulk operation after
	// it was created. Defaults to DefaultCompensated (30 days).
	Compensated time.Duration
	// Audit is how long an entry of the audit trail (an operator action)
	// stays. Defaults to DefaultAudit (90 days).
	Audit time.Duration
	// Interval is the time between the end of a pass of Run and the start
	// of the next. Defaults to DefaultInterval (1 minute).
	Interval time.Duration
	// Logger receives a line per pass that removed something, and errors.
	// Defaults to errors to slog.Default().
	Logger watermill.LoggerAdapter
}

// Removed counts what a pass removed, per kind.
type Removed struct {
	Events  int // outbox events
	Marks   int // inbox dedup marks (processed_event rows)
	Inbox   int // processed inbox rows
	Barrier int // barrier rows
	Sagas   int // sagas, each with its history and stored events
	Bulk    int // bulk operations, each with its records
	Audit   int // audit trail entries
}

func (r Removed) total() int {
	return r.Events + r.Marks + r.Inbox + r.Barrier + r.Sagas + r.Bulk + r.Audit
}

func (r Removed) fields() watermill.LogFields {
	return watermill.LogFields{"events": r.Events, "marks": r.Marks, "inbox": r.Inbox,
		"barrier": r.Barrier, "sagas": r.Sagas, "bulk": r.Bulk, "audit": r.Audit}
}

// Cleaner is the retention job of one schema: see the package doc for what
// it removes. It is safe for concurrent use, and several may run on one
// schema at once.
type Cleaner struct {
	pool   *pgxpool.Pool
	schema string
	cfg    Config
	logger watermill.LoggerAdapter
	sql    statements
	batch  batchSizes
	// afterSagaBatch, when set (by tests), sees each saga batch's count
	// and time.
	afterSagaBatch func(removed int, took time.Duration)
}

// batchSizes are the batch constants, which tests make small.
type batchSizes struct{ events, marks, barrier, sagas, audit int }

// New returns a Cleaner on pool. It does not touch the database. A
// negative duration is an error wrapping core.ErrConfig.
func New(pool *pgxpool.Pool, cfg Config) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: retention: nil pool", core.ErrConfig)
	}
	if cfg.Schema == "" {
		return nil, fmt.Errorf("%w: retention: Config.Schema is required", core.ErrConfig)
	}
	if err := sqlident.ValidateSchema(cfg.Schema); err != nil {
		return nil, fmt.Errorf("%w: retention: Config.Schema: %v", core.ErrConfig, err)
	}
	for _, d := range []struct {
		name  string
		value *time.Duration
		def   time.Duration
	}{
		{"Events", &cfg.Events, DefaultEvents},
		{"Marks", &cfg.Marks, DefaultMarks},
		{"Barrier", &cfg.Barrier, DefaultBarrier},
		{"Completed", &cfg.Completed, DefaultCompleted},
		{"Compensated", &cfg.Compensated, DefaultCompensated},
		{"Audit", &cfg.Audit, DefaultAudit},
		{"Interval", &cfg.Interval, DefaultInterval},
	} {
		if *d.value < 0 {
			return nil, fmt.Errorf("%w: retention: Config.%s must not be negative, got %s", core.ErrConfig, d.name, *d.value)
		}
		if *d.value == 0 {
			*d.value = d.def
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	return &Cleaner{
		pool:   pool,
		schema: cfg.Schema,
		cfg:    cfg,
		logger: cfg.Logger.With(watermill.LogFields{"component": "retention", "schema": cfg.Schema}),
		sql:    newStatements(cfg.Schema),
		batch:  batchSizes{events: eventBatch, marks: markBatch, barrier: barrierBatch, sagas: sagaBatch, audit: auditBatch},
	}, nil
}

// Run makes a pass at once and then every Interval until ctx ends; then it
// returns nil. It fails at once, before the first pass, when the tables
// are missing or a privilege on them is (migrations not applied, a wrong
// schema): it tries every statement of a pass on no rows first. Any other
// error is logged and the pass tried again at the next interval.
func (c *Cleaner) Run(ctx context.Context) error {
	if err := c.probe(ctx); err != nil {
		return err
	}
	periodic.Run(ctx, c.cfg.Interval, func(ctx context.Context) {
		start := time.Now()
		removed, err := c.Pass(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			c.logger.Error("Retention pass failed", err, removed.fields())
		case removed.total() > 0:
			f := removed.fields()
			f["took"] = time.Since(start).String()
			c.logger.Info("Retention pass removed rows", f)
		}
	})
	return nil
}

// Pass removes everything whose window has passed now, kind by kind (see
// Removed), in batches, each its own short statement, and says how much it
// removed. A kind that fails does not keep the others from being cleaned:
// the error names every kind that failed. It stops early, with ctx's
// error, when ctx ends.
func (c *Cleaner) Pass(ctx context.Context) (Removed, error) {
	var now time.Time
	if err := c.pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return Removed{}, fmt.Errorf("retention: %w", err)
	}
	var r Removed
	var errs []error
	for _, kind := range []struct {
		what    string
		removed *int
		clean   func(ctx context.Context, now time.Time) (int, error)
	}{
		{"outbox events", &r.Events, c.cleanEvents},
		{"dedup marks", &r.Marks, c.cleanMarks},
		{"inbox rows", &r.Inbox, c.cleanInbox},
		{"barrier rows", &r.Barrier, c.cleanBarrier},
		{"sagas", &r.Sagas, c.cleanSagas},
		{"bulk operations", &r.Bulk, c.cleanBulk},
		{"audit trail", &r.Audit, c.cleanAudit},
	} {
		n, err := kind.clean(ctx, now)
		*kind.removed = n
		if err != nil {
			errs = append(errs, fmt.Errorf("retention: %s: %w", kind.what, err))
			if ctx.Err() != nil {
				break
			}
		}
	}
	return r, errors.Join(errs...)
}

// cleanEvents removes the outbox events published or discarded before
// their window, oldest first, each batch starting where the last stopped.
func (c *Cleaner) cleanEvents(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-c.cfg.Events)
	var from time.Time // the start of the pass: before any created_at
	total := 0
	for {
		var (
			n    int
			last *time.Time
		)
		if err := c.pool.QueryRow(ctx, c.sql.events, cutoff, c.batch.events, from).Scan(&n, &last); err != nil {
			return total, err
		}
		total += n
		if n < c.batch.events || last == nil {
			return total, nil
		}
		from = *last
	}
}

func (c *Cleaner) cleanMarks(ctx context.Context, now time.Time) (int, error) {
	return c.deleteAll(ctx, c.sql.marks, now.Add(-c.cfg.Marks), c.batch.marks)
}

func (c *Cleaner) cleanInbox(ctx context.Context, now time.Time) (int, error) {
	return c.deleteAll(ctx, c.sql.inbox, now.Add(-c.cfg.Marks), c.batch.marks)
}

// deleteAll runs a DELETE of up to batch rows before cutoff until one
// removes fewer.
func (c *Cleaner) deleteAll(ctx context.Context, sql string, cutoff time.Time, batch int) (int, error) {
	total := 0
	for {
		tag, err := c.pool.Exec(ctx, sql, cutoff, batch)
		if err != nil {
			return total, err
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// cleanBarrier removes the barrier rows of every saga no command of which
// arrived within the window.
func (c *Cleaner) cleanBarrier(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-c.cfg.Barrier)
	total := 0
	for {
		var found, removed int
		if err := c.pool.QueryRow(ctx, c.sql.barrier, cutoff, c.batch.barrier).Scan(&found, &removed); err != nil {
			return total, err
		}
		total += removed
		if found < c.batch.barrier {
			return total, nil
		}
	}
}

// endedStatuses are the statuses sagas are removed in, with their windows.
// A saga in any other status (running, compensating, stuck, paused,
// scheduled, or one a later version adds) is never removed.
var endedStatuses = []struct {
	status string
	window func(Config) time.Duration
}{
	{"completed", func(c Config) time.Duration { return c.Completed }},
	{"compensated", func(c Config) time.Duration { return c.Compensated }},
}

// cleanSagas removes the ended sagas whose window has passed, with their
// history and stored events, status by status, oldest first; a saga that
// was ever stuck also waits for the Compensated window.
func (c *Cleaner) cleanSagas(ctx context.Context, now time.Time) (int, error) {
	stuckCutoff := now.Add(-c.cfg.Compensated)
	total := 0
	for _, ended := range endedStatuses {
		cutoff := now.Add(-ended.window(c.cfg))
		from := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
		fromID := ""
		for {
			start := time.Now()
			var (
				n      int
				last   pgtype.Timestamptz
				lastID string
			)
			if err := c.pool.QueryRow(ctx, c.sql.sagas, ended.status, from, fromID, cutoff, stuckCutoff, c.batch.sagas).
				Scan(&n, &last, &lastID); err != nil {
				return total, fmt.Errorf("%s: %w", ended.status, err)
			}
			total += n
			if c.afterSagaBatch != nil {
				c.afterSagaBatch(n, time.Since(start))
			}
			if n < c.batch.sagas || !last.Valid {
				break
			}
			from, fromID = last, lastID
		}
	}
	// The events sent by key that no saga held: kept as long as a
	// compensated saga's.
	if _, err := c.deleteAll(ctx, c.sql.orphanEvents, stuckCutoff, c.batch.sagas); err != nil {
		return total, fmt.Errorf("events no saga held: %w", err)
	}
	return total, nil
}

// cleanBulk removes the bulk operations created before the Compensated
// window, their records first, a batch at a time, and says how many
// operations it removed.
func (c *Cleaner) cleanBulk(ctx context.Context, now time.Time) (int, error) {
	cutoff := now.Add(-c.cfg.Compensated)
	if _, err := c.deleteAll(ctx, c.sql.bulkItems, cutoff, c.batch.sagas); err != nil {
		return 0, err
	}
	tag, err := c.pool.Exec(ctx, c.sql.bulk, cutoff)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}

// cleanAudit removes the audit trail's entries older than the Audit
// window, oldest first.
func (c *Cleaner) cleanAudit(ctx context.Context, now time.Time) (int, error) {
	return c.deleteAll(ctx, c.sql.audit, now.Add(-c.cfg.Audit), c.batch.audit)
}

// probe runs every statement of a pass on no rows (LIMIT 0, cutoffs at the
// start of time) in a transaction it rolls back (internal/pgprobe): it
// returns an error only for a missing table or privilege; other failures
// (the database is not up yet) are logged and retried until ctx ends.
func (c *Cleaner) probe(ctx context.Context) error {
	var never time.Time
	neverTZ := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	err := pgprobe.Probe(ctx, c.pool, c.cfg.Interval, func(err error, wait time.Duration) {
		c.logger.Error("Retention cannot reach the database at start; retrying", err, watermill.LogFields{"retry_in": wait.String()})
	}, func(tx pgx.Tx) error {
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{c.sql.events, []any{never, 0, never}},
			{c.sql.marks, []any{never, 0}},
			{c.sql.inbox, []any{never, 0}},
			{c.sql.barrier, []any{never, 0}},
			{c.sql.sagas, []any{endedStatuses[0].status, neverTZ, "", never, never, 0}},
			{c.sql.orphanEvents, []any{never, 0}},
			{c.sql.bulkItems, []any{never, 0}},
			{c.sql.bulk, []any{never}},
			{c.sql.audit, []any{never, 0}},
		} {
			if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("retention: cannot use millrace's tables in schema %q (migrations applied? privileges granted?): %w", c.schema, err)
	}
	return nil
}
