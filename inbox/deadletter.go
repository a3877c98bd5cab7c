package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/bulk"
	"github.com/millrace/millrace/internal/sqlident"
)

// DeadLetterConfig configures DeadLetters.
type DeadLetterConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Consumer names the inbox. Required.
	Consumer string
}

// DeadLetter is a dead-lettered inbox message: it failed MaxAttempts times
// (or permanently) and waits for an operator. With OrderByKey, later
// messages of its partition key wait behind it.
type DeadLetter struct {
	ID           int64 // row id in inbox_event; order and paging key (ListParams.AfterID)
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
	trail                  *audit.Trail
	list, requeue, discard string
}

// NewDeadLetters returns the dead-letter API of one consumer's inbox. pool
// may be nil if you only call the ...Tx methods.
func NewDeadLetters(pool *pgxpool.Pool, cfg DeadLetterConfig) (*DeadLetters, error) {
	schema, err := configSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := checkConsumer("DeadLetterConfig.Consumer", cfg.Consumer); err != nil {
		return nil, err
	}
	table := sqlident.Table(schema, "inbox_event")
	return &DeadLetters{
		pool:     pool,
		consumer: cfg.Consumer,
		trail:    audit.New(schema),
		// Uses inbox_event_dead_idx.
		list: fmt.Sprintf(`SELECT id, event_id::text, topic, partition_key, payload, metadata::text, attempts, coalesce(last_error, ''), received_at, dead_at
  FROM %s
 WHERE consumer = $1 AND dead_at IS NOT NULL AND NOT processed AND id > $2
   AND ($3 = '' OR topic = $3)
   AND ($4 = '' OR partition_key = $4)
 ORDER BY id LIMIT $5`, table),
		// Requeue and discard return what they acted on, for the audit
		// trail.
		requeue: fmt.Sprintf(`UPDATE %s SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
 WHERE consumer = $1 AND event_id = ANY($2::uuid[]) AND dead_at IS NOT NULL AND NOT processed
RETURNING event_id::text, topic`, table),
		discard: fmt.Sprintf(`UPDATE %s SET processed = true, processed_at = now(), discarded_at = now()
 WHERE consumer = $1 AND event_id = ANY($2::uuid[]) AND dead_at IS NOT NULL AND NOT processed
RETURNING event_id::text, topic`, table),
	}, nil
}

// List returns the dead-lettered messages p selects, in arrival (row id)
// order: at most p.Limit (default 100), after p.AfterID, of p.Topic and
// p.PartitionKey when set. Page by passing the last ID of one page as the
// next page's AfterID. A negative Limit or AfterID is an error wrapping
// core.ErrInvalidListParams. It takes the same params, with the same
// meaning, as outbox.Admin.List.
func (d *DeadLetters) List(ctx context.Context, p core.ListParams) ([]DeadLetter, error) {
	if d.pool == nil {
		return nil, fmt.Errorf("%w: DeadLetters made without a pool; use the ...Tx methods", core.ErrConfig)
	}
	return d.listQ(ctx, d.pool, p)
}

// ListTx is List in the caller's transaction.
func (d *DeadLetters) ListTx(ctx context.Context, tx pgx.Tx, p core.ListParams) ([]DeadLetter, error) {
	return d.listQ(ctx, tx, p)
}

// querier is what a list needs: a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func (d *DeadLetters) listQ(ctx context.Context, tx querier, p core.ListParams) ([]DeadLetter, error) {
	p, err := bulk.List(p)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters of %s: %w", d.consumer, err)
	}
	rows, err := tx.Query(ctx, d.list, d.consumer, p.AfterID, p.Topic, p.PartitionKey, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list dead letters of %s: %w", d.consumer, err)
	}
	defer rows.Close()
	var out []DeadLetter
	for rows.Next() {
		var (
			e  DeadLetter
			md string
		)
		if err := rows.Scan(&e.ID, &e.EventID, &e.Topic, &e.PartitionKey, &e.Payload, &md, &e.Attempts, &e.LastError, &e.ReceivedAt, &e.DeadAt); err != nil {
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
// eligible at once (their last error is kept). by says who does it and
// why (both required): each message requeued is recorded in the audit
// trail in the same transaction. Ids that are not dead letters of the
// consumer are ignored; the count says how many were requeued. An id that
// is not a UUID fails the whole call, before anything is sent, with an
// error wrapping core.ErrInvalidEventID; an incomplete by with one
// wrapping core.ErrNoActor. This is how outbox.Admin treats them too.
func (d *DeadLetters) Requeue(ctx context.Context, by core.Actor, eventIDs ...string) (int, error) {
	return d.exec(ctx, nil, d.requeue, "requeue", eventIDs, by)
}

// RequeueTx is Requeue in the caller's transaction (its audit entries
// too). An invalid id or Actor leaves tx as it was.
func (d *DeadLetters) RequeueTx(ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error) {
	return d.exec(ctx, tx, d.requeue, "requeue", eventIDs, by)
}

// Discard gives up on dead-lettered messages: they are marked processed
// (and discarded) without running the handler, stay deduplicated until
// retention removes them, and no longer hold their key. Ids and by are
// treated as by Requeue: unknown ids are ignored, one that is not a UUID
// fails the call with core.ErrInvalidEventID, an incomplete by with
// core.ErrNoActor, before anything is sent; each message discarded is
// recorded in the audit trail.
func (d *DeadLetters) Discard(ctx context.Context, by core.Actor, eventIDs ...string) (int, error) {
	return d.exec(ctx, nil, d.discard, "discard", eventIDs, by)
}

// DiscardTx is Discard in the caller's transaction (its audit entries
// too). An invalid id or Actor leaves tx as it was.
func (d *DeadLetters) DiscardTx(ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error) {
	return d.exec(ctx, tx, d.discard, "discard", eventIDs, by)
}

// exec runs sql in tx, or in a transaction of its own when tx is nil.
func (d *DeadLetters) exec(ctx context.Context, tx pgx.Tx, sql, what string, eventIDs []string, by core.Actor) (int, error) {
	if err := audit.Check(by, "inbox: "+what+" dead letters of "+d.consumer); err != nil {
		return 0, err
	}
	ids := make([][16]byte, len(eventIDs)) // as in Deduplicator.eventIDs
	for i, s := range eventIDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return 0, fmt.Errorf("inbox: %s dead letters of %s: event id %q: %w: %v", what, d.consumer, s, core.ErrInvalidEventID, err)
		}
		ids[i] = id
	}
	if len(ids) == 0 {
		return 0, nil
	}
	var entries []audit.Entry
	run := func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, d.consumer, ids)
		if err != nil {
			return err
		}
		after := map[string]string{"requeue": "pending", "discard": "discarded"}[what]
		entries, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (audit.Entry, error) {
			e := audit.Entry{Actor: by, Action: "inbox." + what, Kind: audit.KindInbox, Scope: d.consumer,
				Before: map[string]string{"state": "dead"}, After: map[string]string{"state": after}}
			var topic string
			err := row.Scan(&e.Target, &topic)
			e.Detail = map[string]string{"topic": topic}
			return e, err
		})
		if err != nil {
			return err
		}
		return d.trail.Write(ctx, tx, entries...)
	}
	var err error
	if tx != nil {
		err = run(tx)
	} else {
		if d.pool == nil {
			return 0, fmt.Errorf("%w: DeadLetters made without a pool; use the ...Tx methods", core.ErrConfig)
		}
		err = pgx.BeginFunc(ctx, d.pool, run)
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: %s dead letters of %s: %w", what, d.consumer, err)
	}
	audit.Count(entries...)
	return len(entries), nil
}
