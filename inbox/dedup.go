package inbox

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/dedupmark"
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
	EventID func(msg *message.Message) (string, error)
}

// Deduplicator gives Watermill handlers exactly-once effects. Its
// middleware runs each message's handler in a PostgreSQL transaction that
// also records (consumer, event id) in processed_event; a message whose
// event id is already recorded is acknowledged without running the
// handler. It is safe for concurrent use.
type Deduplicator struct {
	pool     *pgxpool.Pool
	consumer string
	eventID  func(*message.Message) (string, error)
	// beginAndMark is the BEGIN query; %s is the event id. It executes
	// markSQL, prepared on each connection as markName.
	beginAndMark, markSQL, markName string
	// markManySQL records many marks in one statement and returns the
	// event ids it recorded (processed_event's primary key decides).
	markManySQL string
	// markStrictSQL records many ids and fails on any recorded before
	// (internal/dedupmark).
	markStrictSQL string
}

// NewDeduplicator returns a Deduplicator. It does not touch the database.
func NewDeduplicator(pool *pgxpool.Pool, cfg DedupConfig) (*Deduplicator, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", core.ErrConfig)
	}
	schema, err := configSchema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if err := checkConsumer("DedupConfig.Consumer", cfg.Consumer); err != nil {
		return nil, err
	}
	if cfg.EventID == nil {
		cfg.EventID = DefaultEventID
	}
	if strings.Contains(cfg.Consumer, "\\") {
		return nil, fmt.Errorf("%w: DedupConfig.Consumer %q must not contain a backslash", core.ErrConfig, cfg.Consumer)
	}
	// The transaction begins and records the mark in one round trip: the
	// mark is part of the BEGIN query, sent with the simple protocol, so
	// its values are literals (the consumer name quoted here, the event id
	// a parsed UUID). A duplicate fails that query with a unique violation
	// on processed_event's primary key, before the handler runs.
	return &Deduplicator{
		pool:     pool,
		consumer: cfg.Consumer,
		eventID:  cfg.EventID,
		markSQL:  fmt.Sprintf(`INSERT INTO %s (consumer, event_id) VALUES ($1, $2)`, sqlident.Table(schema, "processed_event")),
		markName: "millrace_mark_" + sqlident.Hash(schema),
		markManySQL: fmt.Sprintf(`INSERT INTO %s (consumer, event_id) SELECT $1, e FROM unnest($2::uuid[]) e
ON CONFLICT DO NOTHING
RETURNING event_id`, sqlident.Table(schema, "processed_event")),
		markStrictSQL: fmt.Sprintf(`INSERT INTO %s (consumer, event_id) SELECT $1, e FROM unnest($2::uuid[]) e`, sqlident.Table(schema, "processed_event")),
		beginAndMark: fmt.Sprintf(`BEGIN; EXECUTE %s('%s', '%%s')`,
			"millrace_mark_"+sqlident.Hash(schema), strings.ReplaceAll(cfg.Consumer, "'", "''")),
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
// that is core.Permanent. Place the middleware innermost: PoisonQueue
// outermost, then Retry (with ShouldRetry), then this. The message's
// context is restored before Middleware returns, so a retry starts clean.
func (d *Deduplicator) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (_ []*message.Message, err error) {
		id, err := eventID(d.eventID, msg)
		if err != nil {
			return nil, err
		}
		defer traceDedup(msg, d.consumer, id)(&err) // tracing.go: a span, when tracing is on
		ctx := msg.Context()
		conn, err := d.pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("inbox: consumer %s, event %s: %w", d.consumer, id, err)
		}
		defer conn.Release()
		tx, fresh, err := d.beginMarked(ctx, conn.Conn(), id)
		if err != nil || !fresh {
			return nil, err // !fresh: a duplicate, acknowledged without running h
		}
		done := false
		defer func() {
			if !done {
				rollback(ctx, tx)
			}
		}()
		msg.SetContext(core.ContextWithTx(ctx, tx))
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

// BeginMarked begins a transaction on conn with the mark of msg's event id
// recorded in the round trip of its BEGIN, as Middleware does: MarkTx of
// one message, a round trip sooner, for a consumer that applies one
// message in a transaction it begins itself. fresh is false for an id
// recorded before (a duplicate): then no transaction is left open and tx
// is nil. A message without a usable id fails as with MarkTx, with an
// error wrapping ErrNoEventID that is core.Permanent, and conn is
// untouched. Commit or roll back tx as any other.
func (d *Deduplicator) BeginMarked(ctx context.Context, conn *pgx.Conn, msg *message.Message) (tx pgx.Tx, fresh bool, err error) {
	id, err := eventID(d.eventID, msg)
	if err != nil {
		return nil, false, err
	}
	return d.beginMarked(ctx, conn, id)
}

func (d *Deduplicator) beginMarked(ctx context.Context, conn *pgx.Conn, id uuid.UUID) (pgx.Tx, bool, error) {
	// The mark's statement is prepared once per connection (pgx keeps
	// it); BEGIN then executes it in the same round trip.
	if _, err := conn.Prepare(ctx, d.markName, d.markSQL); err != nil {
		return nil, false, fmt.Errorf("inbox: consumer %s, event %s: prepare: %w", d.consumer, id, err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: fmt.Sprintf(d.beginAndMark, id)})
	if err != nil {
		// The failed INSERT left the transaction block aborted: end it
		// before the connection goes back to the pool.
		_, _ = conn.Exec(ctx, "ROLLBACK")
		if dedupmark.IsDuplicate(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("inbox: consumer %s, event %s: begin and record: %w", d.consumer, id, err)
	}
	return tx, true, nil
}

// MarkTx records the event ids of msgs in tx, in one statement, for
// consumers that apply many messages per transaction, and reports for each
// message whether it is new: false for one recorded before (a duplicate)
// and for a repeat of an earlier message of msgs. Apply the new ones in tx;
// rolled back, tx takes the marks with it. Before anything is written,
// every event id is read: if any message has no usable one, MarkTx returns
// a *core.BatchError naming each such message by its UUID, each error
// wrapping ErrNoEventID and core.Permanent, and tx is untouched.
func (d *Deduplicator) MarkTx(ctx context.Context, tx pgx.Tx, msgs ...*message.Message) ([]bool, error) {
	ids, err := d.eventIDs(msgs)
	if err != nil {
		return nil, err
	}
	fresh := make([]bool, len(msgs))
	if len(msgs) == 0 {
		return fresh, nil
	}
	rows, err := tx.Query(ctx, d.markManySQL, d.consumer, ids)
	if err != nil {
		return nil, fmt.Errorf("inbox: consumer %s: record %d marks: %w", d.consumer, len(msgs), err)
	}
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[[16]byte])
	if err != nil {
		return nil, fmt.Errorf("inbox: consumer %s: record %d marks: %w", d.consumer, len(msgs), err)
	}
	isNew := make(map[[16]byte]bool, len(recorded))
	for _, id := range recorded {
		isNew[id] = true
	}
	for i, id := range ids {
		if isNew[id] {
			fresh[i] = true
			delete(isNew, id) // a repeat within msgs is a duplicate
		}
	}
	return fresh, nil
}

// eventIDs reads the event ids of msgs; any message without a usable one
// makes it return a *core.BatchError naming each such message. They
// are [16]byte, which pgx encodes as a uuid directly (a uuid.UUID goes
// through its driver.Valuer and a failed binary encoding of its string,
// 17 times slower).
func (d *Deduplicator) eventIDs(msgs []*message.Message) ([][16]byte, error) {
	ids := make([][16]byte, len(msgs))
	var bad []core.MessageError
	for i, msg := range msgs {
		id, err := eventID(d.eventID, msg)
		if err != nil {
			bad = append(bad, core.MessageError{UUID: msg.UUID, Err: err})
			continue
		}
		ids[i] = id
	}
	if len(bad) > 0 {
		return nil, &core.BatchError{Errors: bad}
	}
	return ids, nil
}

func init() {
	dedupmark.Strict = func(dedup any, msgs []*message.Message) (string, []any, error) {
		d := dedup.(*Deduplicator)
		ids, err := d.eventIDs(msgs)
		if err != nil {
			return "", nil, err
		}
		return d.markStrictSQL, []any{d.consumer, ids}, nil
	}
}

// consumerName returns the consumer name.
func (d *Deduplicator) consumerName() string { return d.consumer }

// rollback rolls tx back even when ctx has ended, so the connection goes
// back to the pool clean.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
