package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
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
	// interval per Writer, and relays poll as a fallback. An event written
	// within the interval after an announced one, and committed after the
	// relay's batch for that one, waits for the next hint or the relay's
	// short look (from 4ms after work); a shorter interval leaves fewer
	// events to it. Defaults to 1ms (2ms before: in three-step sagas at 50
	// a second, 1ms took the median round trip from 17-19 ms to 11-12,
	// with no loss of throughput measured at 1,000 sagas a second). A
	// negative value turns hints off (for relays in poll-only mode).
	NotifyInterval time.Duration
	// ValidateTopic, if set, checks each event's topic when it is written,
	// against the rules of the transport the relay publishes to; an event
	// it refuses is an *EventError wrapping ErrInvalidEvent, and nothing is
	// sent. With the Kafka relay set it to kafka.ValidateTopic: a topic
	// name Kafka refuses would otherwise only fail at publish time, where
	// it stops its key. Defaults to nil: the outbox does not know the
	// transport (Kafka, AMQP, NATS and others have different rules), so
	// only what every transport needs is checked (a non-empty topic, valid
	// UTF-8 without NUL).
	ValidateTopic func(topic string) error
	// CDC makes the Writer insert only the log row (outbox_event), for a
	// CDCRelay, which reads committed inserts from the WAL: no pending
	// row, no wake-up hint. A polling Relay does not see such events; run
	// a CDCRelay on the schema (see the package doc, "Change data
	// capture"). Defaults to false: the Writer writes for the polling
	// Relay.
	CDC bool
}

// Writer writes events to the outbox in the caller's transaction. It is safe
// for concurrent use; make one per process and share it.
type Writer struct {
	pool           *pgxpool.Pool
	schema         string
	channel        string
	notifyInterval int64
	lastNotify     atomic.Int64
	validateTopic  func(string) error
	sql            writerSQL
}

// NewWriter returns a Writer. pool is used only by Write; it may be nil if
// you only call WriteTx.
func NewWriter(pool *pgxpool.Pool, cfg WriterConfig) (*Writer, error) {
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, configError("WriterConfig.Schema: %w", err)
	}
	if cfg.NotifyInterval == 0 {
		cfg.NotifyInterval = time.Millisecond
	}
	w := &Writer{
		pool:           pool,
		schema:         schema,
		channel:        notifyChannel(schema),
		notifyInterval: int64(cfg.NotifyInterval),
		validateTopic:  cfg.ValidateTopic,
		sql:            newWriterSQL(schema, cfg.CDC),
	}
	if cfg.CDC {
		// No hint: the stream wakes the relay.
		w.notifyInterval = -1
	}
	return w, nil
}

// configError returns a config error that wraps core.ErrConfig; the
// message names the field.
func configError(format string, args ...any) error {
	return fmt.Errorf("outbox: "+format+" (%w)", append(args, core.ErrConfig)...)
}

// notifyChannel is the LISTEN/NOTIFY channel for a schema's outbox. A hash
// keeps it within PostgreSQL's 63-byte identifier limit for any schema name.
func notifyChannel(schema string) string { return "millrace_outbox_" + sqlident.Hash(schema) }

// Write writes events in a transaction of its own.
func (w *Writer) Write(ctx context.Context, events ...Event) ([]string, error) {
	if w.pool == nil {
		return nil, configError("Write needs a Writer made with a pool; use WriteTx")
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
// is not a UUID, a payload that is not JSON, text with NUL or invalid UTF-8,
// a topic or key over MaxKeyBytes, metadata that cannot travel unchanged, a
// topic WriterConfig.ValidateTopic refuses, an id given twice for one topic
// in the call) is reported as an *EventError wrapping ErrInvalidEvent (or,
// for the id given twice, ErrDuplicateEvent), before anything is sent: tx
// is untouched and can go on and commit. A database error aborts tx; roll it
// back. One of them is an event id written before on the same topic, which
// wraps ErrDuplicateEvent.
func (w *Writer) WriteTx(ctx context.Context, tx pgx.Tx, events ...Event) ([]string, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: WriteTx given a nil transaction", ErrNoTx)
	}
	if len(events) == 0 {
		return nil, errNoEvents
	}
	events = withTrace(ctx, events) // tracing.go: the caller's trace context, when tracing is on
	rows, err := w.rows(events)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(events))
	for i := range rows {
		ids[i] = rows[i].idText
	}
	if len(rows) == 1 {
		// The common case, one event per transaction, with scalar
		// parameters: cheaper to encode than ten one-element arrays.
		r := &rows[0]
		args := []any{[16]byte(r.id), r.aggType, r.aggID, r.eventType, r.topic, r.key, r.lane, r.payload, r.binary, r.headers}
		sql := w.sql.insertOne
		if w.notifyDue() {
			sql, args = w.sql.insertOneNotify, append(args, w.channel)
		}
		_, err = tx.Exec(ctx, sql, args...)
	} else {
		args := columns(rows)
		sql := w.sql.insert
		if w.notifyDue() {
			sql, args = w.sql.insertNotify, append(args, w.channel)
		}
		_, err = tx.Exec(ctx, sql, args...)
	}
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "outbox_event_event_id_topic_key" {
			return nil, fmt.Errorf("outbox: write %d event(s): %w (%s): %w", len(rows), ErrDuplicateEvent, pgErr.Detail, err)
		}
		return nil, fmt.Errorf("outbox: write %d event(s): %w", len(rows), err)
	}
	return ids, nil
}

// Validate reports what WriteTx would refuse in events before sending
// anything, the same *EventError, without writing them: a caller that
// builds events from its own state (the saga orchestrator) or from input
// it did not choose (a participant's reply topic, named by the command)
// can tell a permanent fault from a technical failure before it touches
// its transaction. It does not change events.
func (w *Writer) Validate(events ...Event) error {
	_, err := w.rows(events)
	return err
}

// rows checks and encodes events for the insert.
func (w *Writer) rows(events []Event) ([]eventRow, error) {
	rows := make([]eventRow, len(events))
	for i := range events {
		if err := rows[i].set(events[i], i, w.validateTopic); err != nil {
			return nil, err
		}
	}
	if len(rows) > 1 {
		if err := checkDuplicates(rows); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// checkDuplicates refuses a call that gives one event id twice for one
// topic: the second would abort the caller's transaction on the unique index.
func checkDuplicates(rows []eventRow) error {
	type identity struct {
		id    uuid.UUID
		topic string
	}
	seen := make(map[identity]int, len(rows))
	for i := range rows {
		k := identity{rows[i].id, rows[i].topic}
		if first, dup := seen[k]; dup {
			return &EventError{Index: i, ID: rows[i].idText,
				Err: fmt.Errorf("%w: also event %d of the call, topic %q", ErrDuplicateEvent, first, rows[i].topic)}
		}
		seen[k] = i
	}
	return nil
}

// eventRow is an Event checked and encoded for the outbox_event columns.
type eventRow struct {
	id                                    uuid.UUID
	idText                                string
	aggType, aggID, eventType, topic, key string
	lane                                  int16
	payload, binary, headers              []byte // payload is JSON or nil, binary is bytes or nil
}

var noHeaders = []byte("{}")

func (r *eventRow) set(e Event, index int, validateTopic func(string) error) error {
	id, err := e.normalize(index, validateTopic)
	if err != nil {
		return err
	}
	*r = eventRow{id: id, idText: e.ID, aggType: e.AggregateType, aggID: e.AggregateID, eventType: e.EventType,
		topic: e.Topic, key: e.PartitionKey, lane: lane(e.PartitionKey), headers: noHeaders}
	if e.Binary {
		r.binary = e.Payload
		if r.binary == nil {
			r.binary = []byte{}
		}
	} else {
		r.payload = e.Payload
	}
	if len(e.Metadata) > 0 {
		r.headers = headersJSON(e.Metadata)
	}
	return nil
}

// columns turns rows into the ten column arrays of the multi-row insert.
// The event ids go as [16]byte, as in the one-row insert, which pgx
// encodes as a uuid directly: a uuid.UUID goes through its driver.Valuer,
// whose string pgx's binary encoding refuses, with an error built, before
// it parses the string back (17 times slower per id, and most of the
// allocations of the insert's arguments).
func columns(rows []eventRow) []any {
	n := len(rows)
	var (
		ids      = make([][16]byte, n)
		aggTypes = make([]string, n)
		aggIDs   = make([]string, n)
		types    = make([]string, n)
		topics   = make([]string, n)
		keys     = make([]string, n)
		lanes    = make([]int16, n)
		payloads = make([]*string, n)
		binaries = make([][]byte, n)
		headers  = make([]string, n)
	)
	for i, r := range rows {
		ids[i], aggTypes[i], aggIDs[i], types[i] = r.id, r.aggType, r.aggID, r.eventType
		topics[i], keys[i], lanes[i], binaries[i] = r.topic, r.key, r.lane, r.binary
		if r.payload != nil {
			s := string(r.payload)
			payloads[i] = &s
		}
		headers[i] = string(r.headers)
	}
	return []any{ids, aggTypes, aggIDs, types, topics, keys, lanes, payloads, binaries, headers}
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
