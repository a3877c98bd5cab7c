package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
)

// WriterConfig configures a Writer.
type WriterConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// NotifyInterval is the least time between two wake-up hints this Writer
	// sends to relays. A hint is a pg_notify in the writing transaction; a
	// NOTIFY in every transaction halves write throughput (it takes a
	// global lock at commit), so hints are coalesced: at most one per
	// interval per Writer, and relays poll as a fallback. Defaults to 2ms.
	// A negative value turns hints off (for relays in poll-only mode).
	NotifyInterval time.Duration
}

// Writer writes events to the outbox in the caller's transaction. It is safe
// for concurrent use; make one per process and share it.
type Writer struct {
	pool           *pgxpool.Pool
	schema         string
	channel        string
	notifyInterval int64
	lastNotify     atomic.Int64
	insert         string
	insertNotify   string
}

// NewWriter returns a Writer. pool is used only by Write; it may be nil if
// you only call WriteTx.
func NewWriter(pool *pgxpool.Pool, cfg WriterConfig) (*Writer, error) {
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = 2 * time.Millisecond
	}
	w := &Writer{
		pool:           pool,
		schema:         schema,
		channel:        notifyChannel(schema),
		notifyInterval: int64(cfg.NotifyInterval),
	}
	// One round trip writes the log row and its pending row, and when due
	// the wake-up hint.
	w.insert = fmt.Sprintf(`WITH ev AS (
    INSERT INTO %s (event_id, aggregate_type, aggregate_id, event_type, topic, partition_key, lane, payload, payload_bytes, headers)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int2[], $8::text[]::jsonb[], $9::bytea[], $10::text[]::jsonb[])
    RETURNING id, lane, partition_key
), pending AS (
    INSERT INTO %s (id, lane, partition_key) SELECT id, lane, partition_key FROM ev
)
SELECT count(*) FROM ev`, sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending"))
	w.insertNotify = w.insert + `, pg_notify($11, '')`
	return w, nil
}

// notifyChannel is the LISTEN/NOTIFY channel for a schema's outbox. A hash
// keeps it within PostgreSQL's 63-byte identifier limit for any schema name.
func notifyChannel(schema string) string {
	h := fnv.New32a()
	h.Write([]byte(schema))
	return fmt.Sprintf("millrace_outbox_%08x", h.Sum32())
}

// Write writes events in a transaction of its own.
func (w *Writer) Write(ctx context.Context, events ...Event) ([]string, error) {
	if w.pool == nil {
		return nil, fmt.Errorf("outbox: Write needs a Writer made with a pool; use WriteTx")
	}
	var ids []string
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		var err error
		ids, err = w.WriteTx(ctx, tx, events...)
		return err
	})
	return ids, err
}

// WriteTx writes events in the caller's transaction, in one round trip, and
// returns their ids. The events become visible to relays when tx commits,
// and vanish if it rolls back.
//
// An event that fails validation (no topic, empty partition key, an id that
// is not a UUID, a payload that is not JSON) is reported as an *EventError
// wrapping ErrMissingTopic, ErrEmptyPartitionKey, ErrInvalidEventID or
// ErrInvalidJSON, before anything is sent: tx is untouched. A database error
// (such as an event id written before) aborts tx; roll it back.
func (w *Writer) WriteTx(ctx context.Context, tx pgx.Tx, events ...Event) ([]string, error) {
	if len(events) == 0 {
		return nil, ErrNoEvents
	}
	n := len(events)
	var (
		ids       = make([]string, n)
		aggTypes  = make([]string, n)
		aggIDs    = make([]string, n)
		types     = make([]string, n)
		topics    = make([]string, n)
		keys      = make([]string, n)
		lanes     = make([]int16, n)
		payloads  = make([]*string, n)
		binaries  = make([][]byte, n)
		headers   = make([]string, n)
		noHeaders = "{}"
	)
	for i := range events {
		e := events[i] // a copy: defaults are not written back to the caller's slice
		if err := e.normalize(i); err != nil {
			return nil, err
		}
		ids[i], aggTypes[i], aggIDs[i], types[i] = e.ID, e.AggregateType, e.AggregateID, e.EventType
		topics[i], keys[i], lanes[i] = e.Topic, e.PartitionKey, Lane(e.PartitionKey)
		if e.Binary {
			binaries[i] = e.Payload
			if binaries[i] == nil {
				binaries[i] = []byte{}
			}
		} else {
			s := string(e.Payload)
			payloads[i] = &s
		}
		headers[i] = noHeaders
		if len(e.Metadata) > 0 {
			b, err := json.Marshal(e.Metadata)
			if err != nil {
				return nil, &EventError{Index: i, ID: e.ID, Err: fmt.Errorf("%w: %v", ErrInvalidMetadataJSON, err)}
			}
			headers[i] = string(b)
		}
	}
	args := []any{ids, aggTypes, aggIDs, types, topics, keys, lanes, payloads, binaries, headers}
	sql := w.insert
	if w.notifyDue() {
		sql = w.insertNotify
		args = append(args, w.channel)
	}
	var count int
	if err := tx.QueryRow(ctx, sql, args...).Scan(&count); err != nil {
		return nil, fmt.Errorf("outbox: write %d event(s): %w", n, err)
	}
	return ids, nil
}

// notifyDue reports whether this write should carry a wake-up hint, and if
// so claims the slot so that concurrent writes within the interval do not.
func (w *Writer) notifyDue() bool {
	if w.notifyInterval < 0 {
		return false
	}
	now := time.Now().UnixNano()
	last := w.lastNotify.Load()
	return now-last >= w.notifyInterval && w.lastNotify.CompareAndSwap(last, now)
}
