package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/bulk"
	"github.com/millrace/millrace/internal/sqlident"
)

// ErrInvalidReplayFilter is returned by Replay for a filter that selects
// nothing in particular (set at least one field, or All to replay every
// published event retention kept), or whose ranges make no sense (To
// before From, ToID below FromID, negative ids).
var ErrInvalidReplayFilter = errors.New("outbox: invalid replay filter")

// AdminConfig configures an Admin.
type AdminConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// StatsCountLimit is the most pending rows Stats counts exactly; above
	// it Stats.Pending is the planner's estimate of the table size
	// (pg_class.reltuples, fresh after autovacuum or ANALYZE) and
	// Stats.PendingEstimated is set. Defaults to 100,000.
	StatsCountLimit int
	// ReplayChunk is how many log rows one statement of Replay puts back
	// into the pending set. Defaults to 10,000.
	ReplayChunk int
	// CDCSlot is the replication slot whose state Metrics reports (see
	// SlotStats). Defaults to DefaultSlot(Schema); when no such slot
	// exists, Metrics leaves the slot gauges out.
	CDCSlot string
}

// Admin is the operator API of the outbox: it lists, requeues and discards
// dead letters, replays published events, and reports the size of the
// backlog. It is safe for concurrent use, also with running relays.
type Admin struct {
	pool        *pgxpool.Pool
	countLimit  int
	replayChunk int
	pendingRel  string
	channel     string
	cdc         cdcSQL
	cdcSlot     string

	trail *audit.Trail
	sql   adminSQL
}

// NewAdmin returns an Admin on pool.
func NewAdmin(pool *pgxpool.Pool, cfg AdminConfig) (*Admin, error) {
	if pool == nil {
		return nil, configError("NewAdmin needs a pool")
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, configError("AdminConfig.Schema: %w", err)
	}
	if cfg.StatsCountLimit < 0 || cfg.ReplayChunk < 0 {
		return nil, configError("AdminConfig.StatsCountLimit and ReplayChunk must not be negative, got %d and %d", cfg.StatsCountLimit, cfg.ReplayChunk)
	}
	if cfg.CDCSlot != "" && !slotName.MatchString(cfg.CDCSlot) {
		return nil, configError("AdminConfig.CDCSlot %q: use 1-61 lower-case letters, digits or underscores", cfg.CDCSlot)
	}
	if cfg.StatsCountLimit == 0 {
		cfg.StatsCountLimit = 100_000
	}
	if cfg.ReplayChunk == 0 {
		cfg.ReplayChunk = 10_000
	}
	return &Admin{
		pool:        pool,
		countLimit:  cfg.StatsCountLimit,
		replayChunk: cfg.ReplayChunk,
		pendingRel:  sqlident.Table(schema, "outbox_pending"),
		cdc:         newCDCSQL(schema),
		cdcSlot:     cfg.CDCSlot,
		channel:     notifyChannel(schema),
		trail:       audit.New(schema),
		sql:         newAdminSQL(schema),
	}, nil
}

// dbtx is what the Admin needs of a pool or a transaction.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DeadLetter is an event the relay gave up on after its last attempt. It
// stays in the pending set, and by default holds back the later events of
// its partition key, until an operator requeues or discards it.
type DeadLetter struct {
	ID            int64 // row id in outbox_event; order and paging key
	EventID       string
	Topic         string
	PartitionKey  string
	AggregateType string
	AggregateID   string
	EventType     string
	Attempts      int
	LastError     string // why the last attempt failed
	CreatedAt     time.Time
	DeadAt        time.Time
	Payload       []byte
	Binary        bool
	Metadata      map[string]string
}

// List returns dead letters in row id order.
// Negative Limit or AfterID is an error wrapping core.ErrInvalidListParams.
func (a *Admin) List(ctx context.Context, p core.ListParams) ([]DeadLetter, error) {
	p, err := bulk.List(p)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	rows, err := a.pool.Query(ctx, a.sql.listDead, p.AfterID, p.Topic, p.PartitionKey, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadLetter, error) {
		var (
			d      DeadLetter
			deadAt *time.Time
		)
		err := row.Scan(&d.ID, &d.EventID, &d.Topic, &d.PartitionKey, &d.AggregateType, &d.AggregateID,
			&d.EventType, &d.Attempts, &d.LastError, &d.CreatedAt, &deadAt,
			&d.Payload, &d.Binary, &d.Metadata)
		if deadAt != nil {
			d.DeadAt = *deadAt
		}
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return out, nil
}

// Requeue makes dead letters pending again, in a transaction of its own:
// the relay retries them from the first attempt (their last error is kept
// for history). by says who does it and why (both required): each dead
// letter requeued is recorded in the audit trail in the same transaction.
// Ids that are not dead letters are ignored; the count says how many were
// requeued. An id that is not a UUID fails the whole call with an error
// wrapping core.ErrInvalidEventID, an incomplete by with one wrapping
// core.ErrNoActor, before anything is sent. An id written to several
// topics (copies of one message) names each copy: every one of them that
// is a dead letter is requeued (Discard likewise).
func (a *Admin) Requeue(ctx context.Context, by core.Actor, eventIDs ...string) (int, error) {
	return a.deadLetterOp(ctx, nil, "requeue", a.sql.requeue, eventIDs, by)
}

// RequeueTx is Requeue in the caller's transaction (its audit entries
// too).
func (a *Admin) RequeueTx(ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error) {
	return a.deadLetterOp(ctx, tx, "requeue", a.sql.requeue, eventIDs, by)
}

// Discard drops dead letters for good, in a transaction of its own: they
// leave the pending set, their log rows are marked discarded (and removed
// by the service's retention after its window), and the later events of
// their keys flow again. by says who does it and why (both required):
// each dead letter discarded is recorded in the audit trail in the same
// transaction. Ids that are not dead letters are ignored; the count says
// how many were discarded. An id that is not a UUID fails the whole call
// with an error wrapping core.ErrInvalidEventID, an incomplete by with one
// wrapping core.ErrNoActor.
func (a *Admin) Discard(ctx context.Context, by core.Actor, eventIDs ...string) (int, error) {
	return a.deadLetterOp(ctx, nil, "discard", a.sql.discard, eventIDs, by)
}

// DiscardTx is Discard in the caller's transaction (its audit entries
// too).
func (a *Admin) DiscardTx(ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error) {
	return a.deadLetterOp(ctx, tx, "discard", a.sql.discard, eventIDs, by)
}

// deadLetterOp runs op in tx, or in a transaction of its own when tx is
// nil.
func (a *Admin) deadLetterOp(ctx context.Context, tx pgx.Tx, op, sql string, eventIDs []string, by core.Actor) (int, error) {
	if err := audit.Check(by, "outbox: "+op); err != nil {
		return 0, err
	}
	ids, err := parseEventIDs(op, eventIDs)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	var entries []audit.Entry
	run := func(tx pgx.Tx) error {
		var err error
		entries, err = a.deadLetterOpTx(ctx, tx, op, sql, ids, by)
		return err
	}
	if tx != nil {
		err = run(tx)
	} else {
		err = pgx.BeginFunc(ctx, a.pool, run)
	}
	if err != nil {
		return 0, err
	}
	audit.Count(entries...)
	return len(entries), nil
}

func (a *Admin) deadLetterOpTx(ctx context.Context, tx pgx.Tx, op, sql string, ids any, by core.Actor) ([]audit.Entry, error) {
	rows, err := tx.Query(ctx, sql, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", op, err)
	}
	after := map[string]string{"requeue": "pending", "discard": "discarded"}[op]
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (audit.Entry, error) {
		e := audit.Entry{Actor: by, Action: "outbox." + op, Kind: audit.KindOutbox,
			Before: map[string]string{"state": "dead"}, After: map[string]string{"state": after}}
		return e, row.Scan(&e.Target, &e.Scope)
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", op, err)
	}
	if len(entries) == 0 {
		return nil, nil
	}
	// Wake the relays: requeued events are due now, and a discarded dead
	// letter unblocks the events behind it.
	if _, err := tx.Exec(ctx, a.sql.notify, a.channel); err != nil {
		return nil, fmt.Errorf("outbox: %s: wake relays: %w", op, err)
	}
	if err := a.trail.Write(ctx, tx, entries...); err != nil {
		return nil, fmt.Errorf("outbox: %s: %w", op, err)
	}
	return entries, nil
}

// parseEventIDs parses event ids into [16]byte, which pgx encodes as a
// uuid directly (see columns).
func parseEventIDs(op string, eventIDs []string) ([][16]byte, error) {
	ids := make([][16]byte, 0, len(eventIDs))
	for _, s := range eventIDs {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("outbox: %s: event id %q: %w: %v", op, s, core.ErrInvalidEventID, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// ReplayFilter selects published events to publish again. Fields are
// combined with AND; a zero field does not filter.
type ReplayFilter struct {
	// From and To bound created_at: From <= created_at < To.
	From, To time.Time
	// FromID and ToID bound the log's row id (as in DeadLetter.ID; ids
	// follow the order events were written in): FromID <= id <= ToID.
	FromID, ToID int64
	// AggregateType, AggregateID, EventType, Topic and PartitionKey must
	// match exactly.
	AggregateType string
	AggregateID   string
	EventType     string
	Topic         string
	PartitionKey  string
	// All must be set to replay with an otherwise empty filter, that is
	// every published event retention kept.
	All bool
}

func (f ReplayFilter) empty() bool {
	return f.From.IsZero() && f.To.IsZero() && f.FromID == 0 && f.ToID == 0 &&
		f.AggregateType == "" && f.AggregateID == "" && f.EventType == "" && f.Topic == "" && f.PartitionKey == ""
}

func (f ReplayFilter) validate() error {
	if f.empty() && !f.All {
		return fmt.Errorf("%w: it is empty (set a field, or All: true to replay the whole log)", ErrInvalidReplayFilter)
	}
	if f.FromID < 0 || f.ToID < 0 {
		return fmt.Errorf("%w: negative id", ErrInvalidReplayFilter)
	}
	if f.ToID != 0 && f.ToID < f.FromID {
		return fmt.Errorf("%w: ToID %d is below FromID %d", ErrInvalidReplayFilter, f.ToID, f.FromID)
	}
	if !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To) {
		return fmt.Errorf("%w: To %s is not after From %s", ErrInvalidReplayFilter, f.To, f.From)
	}
	return nil
}

// Replay publishes again the published events that filter selects, with
// their original event ids (to rebuild a read model from the log; a
// consumer behind the inbox skips what it applied). It puts them back into the pending set and the relays publish them
// again, in id order per partition key. It works in chunks of
// AdminConfig.ReplayChunk rows, each a statement and transaction of its
// own, so a large replay holds no long locks; if it fails midway, the
// chunks before stay replayed and running it again is safe. It returns how
// many events it queued.
//
// Only what retention kept can be replayed: events published longer ago
// than its window are gone. Events not yet published (pending, dead or
// discarded) are never selected, and an event already queued for replay
// is not queued twice. Consumers that deduplicate on the event id (the
// inbox) skip replayed events they have seen: rebuild a read model under a
// new consumer name, or clear its processed marks first.
//
// by says who replays and why (both required, else an error wrapping
// core.ErrNoActor and nothing is queued): the replay is recorded in the
// audit trail, with the filter and how many events it queued (also after
// a failure midway, as far as it got).
func (a *Admin) Replay(ctx context.Context, filter ReplayFilter, by core.Actor) (int64, error) {
	if err := a.replayable(filter, by); err != nil {
		return 0, err
	}
	n, err := a.replayOn(ctx, a.pool, filter)
	if n > 0 || err == nil {
		e := replayEntry(filter, by, n, err)
		if aerr := a.trail.Write(ctx, a.pool, e); aerr != nil {
			return n, errors.Join(err, fmt.Errorf("outbox: replay: %w", aerr))
		}
		audit.Count(e)
	}
	return n, err
}

// ReplayTx is Replay in the caller's transaction: the events are queued
// when tx commits, all or none, and the audit entry with them. Prefer
// Replay for large selections: here every queued row stays locked until
// tx ends.
func (a *Admin) ReplayTx(ctx context.Context, tx pgx.Tx, filter ReplayFilter, by core.Actor) (int64, error) {
	if err := a.replayable(filter, by); err != nil {
		return 0, err
	}
	n, err := a.replayOn(ctx, tx, filter)
	if err != nil {
		return n, err
	}
	e := replayEntry(filter, by, n, nil)
	if err := a.trail.Write(ctx, tx, e); err != nil {
		return n, fmt.Errorf("outbox: replay: %w", err)
	}
	audit.Count(e)
	return n, nil
}

func (a *Admin) replayable(f ReplayFilter, by core.Actor) error {
	if err := f.validate(); err != nil {
		return err
	}
	return audit.Check(by, "outbox: replay")
}

// replayEntry is a replay's audit entry: the filter, and how many events
// it queued (and its error, when it failed midway).
func replayEntry(f ReplayFilter, by core.Actor, queued int64, err error) audit.Entry {
	d := map[string]any{"filter": f, "queued": queued}
	if err != nil {
		d["error"] = err.Error()
	}
	return audit.Entry{Actor: by, Action: "outbox.replay", Kind: audit.KindOutbox, Scope: f.Topic, Detail: d}
}

func (a *Admin) replayOn(ctx context.Context, db dbtx, f ReplayFilter) (int64, error) {
	var from, to *time.Time
	if !f.From.IsZero() {
		from = &f.From
	}
	if !f.To.IsZero() {
		to = &f.To
	}
	cursor := int64(0)
	if f.FromID > 0 {
		cursor = f.FromID - 1
	}
	upper := int64(1<<63 - 1)
	if f.ToID > 0 {
		upper = f.ToID
	}
	var total int64
	for {
		var (
			last        *int64
			selected, n int64
		)
		err := db.QueryRow(ctx, a.sql.replay, cursor, upper, from, to,
			f.AggregateType, f.AggregateID, f.EventType, f.Topic, a.replayChunk, f.PartitionKey).Scan(&last, &selected, &n)
		if err != nil {
			return total, fmt.Errorf("outbox: replay after id %d: %w", cursor, err)
		}
		total += n
		if n > 0 {
			if _, err := db.Exec(ctx, a.sql.notify, a.channel); err != nil {
				return total, fmt.Errorf("outbox: replay: wake relays: %w", err)
			}
		}
		if last == nil || selected < int64(a.replayChunk) {
			return total, nil
		}
		cursor = *last
	}
}

// Stats is a snapshot of the outbox backlog.
type Stats struct {
	// Pending counts events waiting to be published, including those
	// waiting for a retry, not dead letters.
	Pending int64
	// PendingEstimated is set when Pending is above
	// AdminConfig.StatsCountLimit and so an estimate.
	PendingEstimated bool
	// Dead counts dead letters.
	Dead int64
	// Blocked counts events that failed and wait for a retry (not dead).
	Blocked int64
	// OldestPendingAge is how long ago the oldest pending event (lowest
	// id, not dead) was written; zero when nothing is pending.
	OldestPendingAge time.Duration
}

// Stats reports the size of the backlog in one round trip. It is cheap
// enough for a metrics scrape: the pending count stops at
// AdminConfig.StatsCountLimit rows, dead and blocked rows are counted on a
// small partial index, and the oldest pending event is found by primary key.
func (a *Admin) Stats(ctx context.Context) (Stats, error) {
	var (
		s         Stats
		reltuples *int64
		age       *float64
	)
	err := a.pool.QueryRow(ctx, a.sql.stats, a.countLimit+1, a.pendingRel).
		Scan(&s.Pending, &s.Dead, &s.Blocked, &reltuples, &age)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if s.Pending > int64(a.countLimit) {
		s.PendingEstimated = true
		if reltuples != nil && *reltuples-s.Dead > s.Pending {
			s.Pending = *reltuples - s.Dead
		}
	}
	if age != nil && *age > 0 {
		s.OldestPendingAge = time.Duration(*age * float64(time.Second))
	}
	return s, nil
}
