// Package retention removes what has ended from millrace's tables: a
// placeholder over the four cleaners until they move here.
package retention

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// Defaults of Config.
const (
	DefaultEvents      = 7 * 24 * time.Hour
	DefaultMarks       = 7 * 24 * time.Hour
	DefaultBarrier     = 7 * 24 * time.Hour
	DefaultCompleted   = 7 * 24 * time.Hour
	DefaultCompensated = 30 * 24 * time.Hour
	DefaultInterval    = time.Minute
)

// Config says what a Cleaner removes from one schema, and how.
type Config struct {
	Schema                                         string
	Events, Marks, Barrier, Completed, Compensated time.Duration
	Interval                                       time.Duration
	Logger                                         watermill.LoggerAdapter
}

// Cleaner removes ended rows.
type Cleaner struct {
	runs []func(context.Context) error
}

// New returns a Cleaner.
func New(pool *pgxpool.Pool, cfg Config) (*Cleaner, error) {
	o, err := outbox.NewCleaner(pool, outbox.CleanerConfig{Schema: cfg.Schema, Retention: cfg.Events, Interval: cfg.Interval, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	i, err := inbox.NewCleaner(pool, inbox.CleanerConfig{Schema: cfg.Schema, Retention: cfg.Marks, Interval: cfg.Interval, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	c, err := compensation.NewCleaner(pool, compensation.CleanerConfig{Schema: cfg.Schema, Window: cfg.Barrier, Interval: cfg.Interval, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	s, err := saga.NewCleaner(pool, saga.CleanerConfig{Schema: cfg.Schema, CompletedAfter: cfg.Completed, CompensatedAfter: cfg.Compensated,
		StuckAfter: cfg.Compensated, BulkAfter: cfg.Compensated, Interval: cfg.Interval, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &Cleaner{runs: []func(context.Context) error{o.Run, i.Run, c.Run, s.Run}}, nil
}

// Run runs the cleaners until ctx ends.
func (c *Cleaner) Run(ctx context.Context) error {
	var g errgroup.Group
	for _, r := range c.runs {
		g.Go(func() error { return r(ctx) })
	}
	return g.Wait()
}
