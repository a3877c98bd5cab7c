package inbox

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
	// Retention is how long dedup marks (processed_event) and processed
	// inbox rows are kept. It must outlast the longest redelivery or replay
	// horizon: a duplicate that arrives after its mark was deleted is
	// applied again. Defaults to 7 days.
	Retention time.Duration
	// BatchSize is the number of rows deleted per statement, so the job
	// never holds many locks or bloats one transaction. Defaults to 1000.
	BatchSize int
	// Interval is the wait between two cleaning rounds of Run.
	// Defaults to 1 minute.
	Interval time.Duration
	// Logger receives failed rounds and what each round deleted. Defaults
	// to errors to slog.Default() (outbox.DefaultLogger).
	Logger watermill.LoggerAdapter
	// OnError, when set, is called with the error of a failed round of
	// Run (the next round retries). Defaults to nil.
	OnError func(error)
}

// CleanResult says what one cleaning round deleted.
type CleanResult struct {
	ProcessedEvents int64 // rows of processed_event
	InboxEvents     int64 // processed rows of inbox_event
}

// Cleaner deletes dedup marks and processed inbox rows older than the
// retention window, for every consumer of the schema, in small batches. It
// is safe for concurrent use, and several may run at once.
type Cleaner struct {
	pool               *pgxpool.Pool
	cfg                CleanerConfig
	marks, inboxEvents string
}

// NewCleaner returns a Cleaner. It does not touch the database.
func NewCleaner(pool *pgxpool.Pool, cfg CleanerConfig) (*Cleaner, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", core.ErrConfig)
	}
	schema, err := configSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.Retention < 0 || cfg.BatchSize < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("%w: negative CleanerConfig value", core.ErrConfig)
	}
	if cfg.Retention == 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 1000
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Minute
	}
	pe, ie := sqlident.Table(schema, "processed_event"), sqlident.Table(schema, "inbox_event")
	return &Cleaner{
		pool: pool,
		cfg:  cfg,
		// Uses processed_event_processed_at_idx (BRIN); SKIP LOCKED lets two
		// cleaners share the work.
		marks: fmt.Sprintf(`DELETE FROM %s WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM %s WHERE processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, pe, pe),
		// Uses inbox_event_processed_at_idx.
		inboxEvents: fmt.Sprintf(`DELETE FROM %s WHERE id = ANY(ARRAY(
    SELECT id FROM %s WHERE processed AND processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, ie, ie),
	}, nil
}

// CleanOnce deletes everything older than the window, one batch per
// statement, until nothing is left.
func (c *Cleaner) CleanOnce(ctx context.Context) (CleanResult, error) {
	var res CleanResult
	cutoff := time.Now().Add(-c.cfg.Retention)
	for _, job := range []struct {
		sql   string
		count *int64
	}{{c.marks, &res.ProcessedEvents}, {c.inboxEvents, &res.InboxEvents}} {
		for {
			tag, err := c.pool.Exec(ctx, job.sql, cutoff, c.cfg.BatchSize)
			if err != nil {
				return res, fmt.Errorf("inbox: clean: %w", err)
			}
			*job.count += tag.RowsAffected()
			if tag.RowsAffected() < int64(c.cfg.BatchSize) {
				break
			}
		}
	}
	return res, nil
}

// Run cleans every Interval until ctx ends, then returns nil. Errors are
// retried at the next round.
func (c *Cleaner) Run(ctx context.Context) error {
	periodic.Run(ctx, c.cfg.Interval, func(ctx context.Context) {
		n, err := c.CleanOnce(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			c.cfg.Logger.Error("Inbox clean failed", err, watermill.LogFields{"marks_deleted": n.ProcessedEvents, "inbox_rows_deleted": n.InboxEvents})
			if c.cfg.OnError != nil {
				c.cfg.OnError(err)
			}
		case n.ProcessedEvents+n.InboxEvents > 0:
			c.cfg.Logger.Info("Inbox cleaned", watermill.LogFields{"marks_deleted": n.ProcessedEvents, "inbox_rows_deleted": n.InboxEvents})
		}
	})
	return nil
}
