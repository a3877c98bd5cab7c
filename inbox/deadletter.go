package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
)

// ErrNotDead is returned by Requeue and Discard when none of the given
// event ids is a dead-lettered message of the consumer.
var ErrNotDead = errors.New("inbox: no such dead-lettered message")

// DeadLetterConfig configures DeadLetters.
type DeadLetterConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the inbox. Required.
	Consumer string
}

// DeadEvent is a dead-lettered inbox message: it failed MaxAttempts times
// (or permanently) and waits for an operator. With OrderByKey, later
// messages of its partition key wait behind it.
type DeadEvent struct {
	EventID      string
	Topic        string
	PartitionKey string
	Payload      []byte
	Metadata     map[string]string
	Attempts     int
	LastError    string
	ReceivedAt   time.Time
	DeadAt       time.Time
}

// DeadLetters lists, requeues and discards an inbox's dead-lettered
// messages. It is safe for concurrent use.
type DeadLetters struct {
	pool                   *pgxpool.Pool
	consumer               string
	list, requeue, discard string
}

// NewDeadLetters returns the dead-letter API of one consumer's inbox. pool
// may be nil if you only call the ...Tx methods.
func NewDeadLetters(pool *pgxpool.Pool, cfg DeadLetterConfig) (*DeadLetters, error) {
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.Consumer == "" {
		return nil, fmt.Errorf("%w: DeadLetterConfig.Consumer is required", ErrConfig)
	}
	table := sqlident.Table(schema, "inbox_event")
	return &DeadLetters{
		pool:     pool,
		consumer: cfg.Consumer,
		// Uses inbox_event_dead_idx.
		list: fmt.Sprintf(`SELECT event_id::text, topic, partition_key, payload, metadata::text, attempts, coalesce(last_error, ''), received_at, dead_at
  FROM %s WHERE consumer = $1 AND dead_at IS NOT NULL AND NOT processed
 ORDER BY id LIMIT $2`, table),
		requeue: fmt.Sprintf(`UPDATE %s SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
 WHERE consumer = $1 AND event_id = ANY($2::uuid[]) AND dead_at IS NOT NULL AND NOT processed`, table),
		discard: fmt.Sprintf(`UPDATE %s SET processed = true, processed_at = now(), discarded_at = now()
 WHERE consumer = $1 AND event_id = ANY($2::uuid[]) AND dead_at IS NOT NULL AND NOT processed`, table),
	}, nil
}

// List returns up to limit dead-lettered messages, oldest first. limit
// defaults to 100 when not positive.
func (d *DeadLetters) List(ctx context.Context, limit int) ([]DeadEvent, error) {
	if d.pool == nil {
		return nil, fmt.Errorf("%w: DeadLetters made without a pool; use the ...Tx methods", ErrConfig)
	}
	return d.listQ(ctx, d.pool, limit)
}

// ListTx is List in the caller's transaction.
func (d *DeadLetters) ListTx(ctx context.Context, tx pgx.Tx, limit int) ([]DeadEvent, error) {
	return d.listQ(ctx, tx, limit)
}

// querier is what a list needs: a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (d *DeadLetters) listQ(ctx context.Context, tx querier, limit int) ([]DeadEvent, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := tx.Query(ctx, d.list, d.consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters of %s: %w", d.consumer, err)
	}
	defer rows.Close()
	var out []DeadEvent
	for rows.Next() {
		var (
			e  DeadEvent
			md string
		)
		if err := rows.Scan(&e.EventID, &e.Topic, &e.PartitionKey, &e.Payload, &md, &e.Attempts, &e.LastError, &e.ReceivedAt, &e.DeadAt); err != nil {
			return nil, fmt.Errorf("inbox: list dead letters of %s: %w", d.consumer, err)
		}
		if err := json.Unmarshal([]byte(md), &e.Metadata); err != nil {
			return nil, fmt.Errorf("inbox: dead letter %s: metadata: %w", e.EventID, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: list dead letters of %s: %w", d.consumer, err)
	}
	return out, nil
}

// Requeue gives dead-lettered messages a fresh start: attempts back to 0,
// eligible at once. It returns how many were requeued, and ErrNotDead if
// none of eventIDs was dead.
func (d *DeadLetters) Requeue(ctx context.Context, eventIDs ...string) (int, error) {
	return d.exec(ctx, nil, d.requeue, "requeue", eventIDs)
}

// RequeueTx is Requeue in the caller's transaction.
func (d *DeadLetters) RequeueTx(ctx context.Context, tx pgx.Tx, eventIDs ...string) (int, error) {
	return d.exec(ctx, tx, d.requeue, "requeue", eventIDs)
}

// Discard gives up on dead-lettered messages: they are marked processed
// (and discarded) without running the handler, stay deduplicated until
// retention removes them, and no longer hold their key. It returns how
// many were discarded, and ErrNotDead if none of eventIDs was dead.
func (d *DeadLetters) Discard(ctx context.Context, eventIDs ...string) (int, error) {
	return d.exec(ctx, nil, d.discard, "discard", eventIDs)
}

// DiscardTx is Discard in the caller's transaction.
func (d *DeadLetters) DiscardTx(ctx context.Context, tx pgx.Tx, eventIDs ...string) (int, error) {
	return d.exec(ctx, tx, d.discard, "discard", eventIDs)
}

func (d *DeadLetters) exec(ctx context.Context, tx pgx.Tx, sql, what string, eventIDs []string) (int, error) {
	var (
		n   int64
		err error
	)
	if tx != nil {
		tag, e := tx.Exec(ctx, sql, d.consumer, eventIDs)
		n, err = tag.RowsAffected(), e
	} else {
		if d.pool == nil {
			return 0, fmt.Errorf("%w: DeadLetters made without a pool; use the ...Tx methods", ErrConfig)
		}
		tag, e := d.pool.Exec(ctx, sql, d.consumer, eventIDs)
		n, err = tag.RowsAffected(), e
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: %s dead letters of %s: %w", what, d.consumer, err)
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: consumer %s, events %v", ErrNotDead, d.consumer, eventIDs)
	}
	return int(n), nil
}
