package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/internal/sqlident"
)

// DedupConfig configures a Deduplicator.
type DedupConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the consumer: each name deduplicates on its own, so
	// two services (or two handlers of one service) that consume the same
	// events need two names. Required.
	Consumer string
	// EventID returns a message's event id, which must be a UUID.
	// Defaults to DefaultEventID: metadata "event_id", else the message UUID.
	EventID EventIDFunc
}

// Deduplicator gives Watermill handlers exactly-once effects. Its
// middleware runs each message's handler in a PostgreSQL transaction that
// also records (consumer, event id) in processed_event; a message whose
// event id is already recorded is acknowledged without running the
// handler. It is safe for concurrent use.
type Deduplicator struct {
	pool     *pgxpool.Pool
	consumer string
	eventID  EventIDFunc
	mark     string
}

// NewDeduplicator returns a Deduplicator. It does not touch the database.
func NewDeduplicator(pool *pgxpool.Pool, cfg DedupConfig) (*Deduplicator, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrConfig)
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.Consumer == "" {
		return nil, fmt.Errorf("%w: DedupConfig.Consumer is required", ErrConfig)
	}
	if cfg.EventID == nil {
		cfg.EventID = DefaultEventID
	}
	return &Deduplicator{
		pool:     pool,
		consumer: cfg.Consumer,
		eventID:  cfg.EventID,
		// Relies on processed_event's primary key (consumer, event_id).
		mark: fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			sqlident.Table(schema, "processed_event")),
	}, nil
}

// Middleware wraps h: per message it begins a transaction, records the
// event id, and runs h with the transaction in msg.Context() (see
// TxFromContext). Then:
//
//   - the id was recorded before (a duplicate): the transaction is rolled
//     back and the message acknowledged, h does not run;
//   - h fails (or panics): everything rolls back, the mark too, and the
//     error is returned so that Retry or a redelivery runs h again;
//   - h succeeds: the transaction commits; a failed commit is returned as
//     an error. Messages h returns are passed on unchanged (the Router
//     publishes them after the commit, outside it: emit events through the
//     outbox instead for exactly-once output).
//
// A message without a usable id fails with an error wrapping ErrNoEventID
// that is millrace.Permanent. Place the middleware innermost: PoisonQueue
// outermost, then Retry (with ShouldRetry), then this. The message's
// context is restored before Middleware returns, so a retry starts clean.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		id, err := eventID(d.eventID, msg)
		if err != nil {
			return nil, err
		}
		ctx := msg.Context()
		tx, err := d.pool.Begin(ctx)
		if err != nil {
			return nil, fmt.Errorf("inbox: consumer %s, event %s: begin: %w", d.consumer, id, err)
		}
		done := false
		defer func() {
			if !done {
				rollback(ctx, tx)
			}
		}()
		tag, err := tx.Exec(ctx, d.mark, d.consumer, id)
		if err != nil {
			return nil, fmt.Errorf("inbox: consumer %s, event %s: record: %w", d.consumer, id, err)
		}
		if tag.RowsAffected() == 0 {
			return nil, nil // a duplicate: acknowledge without running h
		}
		msg.SetContext(millrace.ContextWithTx(ctx, tx))
		defer msg.SetContext(ctx)
		out, err := h(msg)
		if err != nil {
			return out, err
		}
		done = true
		if err := tx.Commit(ctx); err != nil {
			return nil, fmt.Errorf("inbox: consumer %s, event %s: commit: %w", d.consumer, id, err)
		}
		return out, nil
	}
}

// Consumer returns the consumer name.
func (d *Deduplicator) Consumer() string { return d.consumer }

// rollback rolls tx back even when ctx has ended, so the connection goes
// back to the pool clean.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
