package outbox

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/sqlident"
)

// relaySQL are the polling relay's statements on one schema, built once by
// NewRelay (newRelaySQL).
type relaySQL struct {
	// lockLanes locks the lanes of the first claimable events (the look
	// for work); claimNoted claims in the lanes it locked, in the same
	// round trip. lockWindow locks a window of lanes, and claim claims in
	// the lanes it is given. claimableLanes asks, outside a transaction,
	// for the lanes of what is claimable. unclaim returns the events of a
	// batch that did not go out to the pending set.
	lockLanes, claimNoted, lockWindow, claim, claimableLanes, unclaim string
	// beginStatements begin a batch's transaction, sent in the round trip
	// of its first lock; begin is them as one query.
	beginStatements []string
	begin           pgx.TxOptions
}

// newRelaySQL builds the statements; handedOverOnly for the polling half
// of a CDC relay, which leaves the rows a polling Writer wrote to the
// stream (claimable).
func newRelaySQL(schema string, syncCommit, handedOverOnly bool) relaySQL {
	pending, events, lanes := sqlident.Table(schema, "outbox_pending"), sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_lane")
	claimable := func(holdDead string) string { return claimable(pending, events, holdDead, handedOverOnly) }
	s := relaySQL{
		lockLanes:      lockLanesSQL(pending, lanes, claimable),
		claimNoted:     claimSQL(pending, events, notedLanes, "$1", "$2", claimable),
		lockWindow:     fmt.Sprintf(`SELECT lane FROM %s ORDER BY (lane + $1) %% %d LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED`, lanes, Lanes),
		claim:          claimSQL(pending, events, "$1::smallint[]", "$2", "$3", claimable),
		claimableLanes: claimableLanesSQL(pending, claimable),
		unclaim:        unclaimSQL(pending, events, false),
	}
	s.beginStatements = []string{"BEGIN", batchSettings(syncCommit)}
	s.begin = pgx.TxOptions{BeginQuery: strings.Join(s.beginStatements, "; ")}
	return s
}

// lockLanesSQL is the look for work: it locks the lanes of the first
// claimable events. The lanes of a batch are locked first, in a statement
// of their own, so that the claim's snapshot is taken after the locks are
// held: it then sees everything the lanes' previous holder committed, and cannot
// claim rows that holder already published. Lanes are taken from a
// rotating start so that relays and workers do not all queue on lane 0
// (index: outbox_lane's primary key).
//
// Only lanes with something to claim are locked: those of the first
// BatchSize events the claim could take (the same conditions, in id
// order). A row lock writes a WAL record, and locking a whole window of
// lanes for a batch of one event, hundreds of times a second, wrote
// more WAL than the events did and slowed every commit on the
// database. The statement returns no row when nothing can be claimed
// or all of it is in lanes other batches hold, and a single NULL when
// other batches hold the lanes of the first BatchSize events and there
// may be more behind them: the batch then locks a window of lanes
// (lockWindow), so that a backlog still goes out in parallel. $1
// offset, $2 lanes at most, $3 BatchSize, $4 whether dead letters hold
// their keys.
func lockLanesSQL(pending, lanes string, claimable func(holdDead string) string) string {
	return fmt.Sprintf(`WITH head AS MATERIALIZED (
    SELECT q.lane FROM %[1]s q
     WHERE %[4]s
     ORDER BY q.id
     LIMIT $3
), got AS (
    SELECT l.lane FROM %[2]s l
     WHERE l.lane IN (SELECT lane FROM head)
     ORDER BY (l.lane + $1) %% %[3]d
     LIMIT $2
       FOR NO KEY UPDATE SKIP LOCKED
), %[5]s
SELECT lane FROM got WHERE (SELECT v FROM noted) IS NOT NULL
UNION ALL
SELECT NULL::smallint WHERE NOT EXISTS (SELECT 1 FROM got) AND (SELECT count(*) FROM head) >= $3`, pending, lanes, Lanes, claimable("$4"), noteLanes)
}

// claimSQL is the claim: it takes a batch out of the pending set and marks it published
// in one statement, before publishing: the transaction commits only
// after the broker acknowledged, so a crash or an outage rolls it back
// and the events are pending again. The inner SELECT walks
// outbox_pending's primary key in id order; a key with a failing (or,
// unless skipped, dead) event waits behind it, a probe that uses
// outbox_pending_blocked_idx, empty while everything flows. The mark is
// a HOT update (published_at is in no index; the log's fillfactor leaves
// room). "id = ANY(ARRAY(...))" keeps the DELETE on primary-key lookups
// (with "IN (...)" the planner hashes a scan of the whole pending set).
// Rows come back in no particular order; the relay sorts them.
//
// claim takes the lanes as its parameter $1. claimNoted claims in the
// lanes lockLanes noted in the transaction (noteLanes), so that it can
// go out in the lock's round trip: it still runs after the lock, on a
// snapshot taken after the lanes were locked; with no lane noted it
// claims nothing, without a scan. The window of a drain goes through
// claim: PostgreSQL matches a parameter's many lanes by a hash, an
// InitPlan's one by one (a window of 64 lanes made a drain's claim 15%
// slower).
func claimSQL(pending, events, lanes, limit, hold string, claimable func(holdDead string) string) string {
	return fmt.Sprintf(`WITH claimed AS (
    DELETE FROM %[1]s
     WHERE id = ANY(ARRAY(SELECT q.id FROM %[1]s q
                   WHERE q.lane = ANY(%[4]s) AND %[3]s
                     AND cardinality(%[4]s) > 0
                   ORDER BY q.id
                   LIMIT %[5]s))
    RETURNING id, blocked, next_attempt_at
)
UPDATE %[2]s e SET published_at = now()
  FROM claimed c
 WHERE e.id = c.id
RETURNING e.id, e.event_id::text, e.topic, e.partition_key, e.aggregate_type, e.aggregate_id, e.event_type,
          e.payload, e.payload_bytes, e.headers, e.attempts, c.blocked, c.next_attempt_at`, pending, events, claimable(hold), lanes, limit)
}

// claimableLanesSQL is the question of an askFirst batch (see look), and the
// question for more work after a batch (see commit), outside a
// transaction: the lanes of the first $2 events the claim could take,
// in id order (none: nothing is claimable). $1 whether dead letters
// hold their keys. It walks the pending set in id order rather than
// asking EXISTS: PostgreSQL drops the ORDER BY of an EXISTS and scans
// the table from its start, and the pending set's live rows are its
// newest, behind every page of the rows published since the last
// vacuum (measured over a relay's first minute at 1,000 events/s:
// 72-107 pages read per question on average; 4-7 in the primary key's
// order, which reads the live rows' pages and the few index pages
// before them).
func claimableLanesSQL(pending string, claimable func(holdDead string) string) string {
	return fmt.Sprintf(`SELECT coalesce(array_agg(h.lane), '{}') FROM (SELECT q.lane FROM %s q WHERE %s ORDER BY q.id LIMIT $2) h`, pending, claimable("$1"))
}

// unclaimSQL returns the events of a batch that did not go out to the
// pending set: failed (err not null: blocked, due again at next_at,
// perhaps dead, charged an attempt unless the failure was temporary), or,
// held behind a failed event of their key, as they were.
//
// With streamed (the CDC relay's events, never claimed from the pending
// set), the rows are handed to the polling half (next_attempt_at set, now
// when due at once), and an event already handed to it (the stream read
// again) keeps its state there and is charged nothing again; a row a
// polling Writer wrote for the event is taken over.
func unclaimSQL(pending, events string, streamed bool) string {
	nextAt, onConflict, onlyInserted := "f.next_at", "", ""
	if streamed {
		nextAt = "coalesce(f.next_at, now())"
		onConflict = `
    ON CONFLICT (id) DO UPDATE SET blocked = excluded.blocked, dead = excluded.dead, next_attempt_at = excluded.next_attempt_at
     WHERE p.next_attempt_at IS NULL
    RETURNING id`
		onlyInserted = " JOIN q ON q.id = f.id"
	}
	return fmt.Sprintf(`WITH f AS (
    SELECT * FROM unnest($1::int8[], $2::bool[], $3::bool[], $4::timestamptz[], $5::text[], $6::bool[]) AS f(id, blocked, dead, next_at, err, charge)
), q AS (
    INSERT INTO %[1]s AS p (id, lane, partition_key, blocked, dead, next_attempt_at)
    SELECT e.id, e.lane, e.partition_key, f.blocked, f.dead, %[5]s FROM f JOIN %[2]s e ON e.id = f.id%[3]s
)
UPDATE %[2]s e SET published_at = NULL,
       attempts = e.attempts + f.charge::int,
       last_error = coalesce(f.err, e.last_error),
       next_attempt_at = f.next_at,
       dead_at = CASE WHEN f.dead THEN now() END
  FROM f%[4]s
 WHERE e.id = f.id`, pending, events, onConflict, onlyInserted, nextAt)
}

// batchSettings is the statement that sets up a batch's transaction. The
// claim marks what it took in outbox_event by joining the rows it deleted, a handful to BatchSize, to the log: by the log's primary key,
// a row at a time, is right for any size of the log. PostgreSQL keeps
// the plan it made for the statement's first executions, and on a
// fresh or emptied log, before autovacuum has analyzed it, that plan
// hashes a sequential scan of the whole log, and goes on scanning it
// as it grows (measured over a relay's first minute at 1,000 events/s
// on a fresh schema: 320-610 pages read per claim on average, 1.1-2.0
// ms; 18 pages and 0.06 ms with these settings). With hash and merge
// joins off, for the batch's transaction only, every plan it makes
// joins through the index.
//
// Without SyncCommit the same statement turns synchronous_commit off
// for the transaction (what SET LOCAL does): one statement where there
// were two, and each statement costs PostgreSQL an executor's start and
// end, which at a batch of one or two events is much of the batch's
// cost.
func batchSettings(syncCommit bool) string {
	settings := "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)"
	if !syncCommit {
		settings += ", set_config('synchronous_commit', 'off', true)"
	}
	return settings
}

// A batch's lane lock notes the lanes it locked in a transaction-local
// setting, for the claim sent behind it in the same round trip: noteLanes
// is the lock's CTE that sets it (from its CTE got), notedLanes the claim's
// expression that reads it (empty when nothing noted it).
const (
	noteLanes  = `noted AS MATERIALIZED (SELECT set_config('millrace.relay_lanes', coalesce(array_agg(lane)::text, '{}'), true) AS v FROM got)`
	notedLanes = `(SELECT coalesce(nullif(current_setting('millrace.relay_lanes', true), ''), '{}')::smallint[])::smallint[]`
)

// claimable is the condition on a row q of the pending set that the claim
// can take it: not dead, not waiting out a retry, and not held behind a
// failing (or, when holdDead, the SQL parameter that says so, is true, a
// dead) event of its key. The claim and the look for work in lockLanes
// share it: a look that counted held events as work could lock only their
// lanes, and leave the rest of the outbox waiting behind a dead letter.
// Copies of one event on other topics (a fan-out) are not held behind the
// copy that failed: they are not later events of its key, and a copy its
// topic refuses for good would else keep the others from their topics
// forever. The event ids are looked up only for a failing row of the key.
//
// With handedOverOnly (a CDC relay's polling half), only rows handed to
// the pending set (next_attempt_at set: diverted or failed stream events,
// requeued dead letters, replays, what a backfill queued) are claimable:
// a row a polling Writer wrote (next_attempt_at null) is in the stream
// too, and the stream publishes it in commit order with the others.
func claimable(pending, events, holdDead string, handedOverOnly bool) string {
	cond := fmt.Sprintf(`NOT q.dead AND (NOT q.blocked OR q.next_attempt_at <= now())
       AND NOT EXISTS (SELECT 1 FROM %[1]s b
                        WHERE b.blocked AND b.partition_key = q.partition_key AND b.id < q.id
                          AND (NOT b.dead OR %[3]s)
                          AND (SELECT be.event_id FROM %[2]s be WHERE be.id = b.id)
                              IS DISTINCT FROM (SELECT qe.event_id FROM %[2]s qe WHERE qe.id = q.id))`, pending, events, holdDead)
	if handedOverOnly {
		cond += " AND q.next_attempt_at IS NOT NULL"
	}
	return cond
}
