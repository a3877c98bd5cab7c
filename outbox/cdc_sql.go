package outbox

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// cdcSQL are the statements of the CDC relay and of CDC's setup, recovery
// and status, on one schema, built once (newCDCSQL).
//
// The CDC relay's stream and its polling half share the pending set. A
// row handed to the polling half has next_attempt_at set (now() when it is
// due at once); a row a polling Writer wrote has it null, and is the
// stream's: the stream delivers its insert in commit order with the
// others, publishes it and deletes the row (see claimable).
type cdcSQL struct {
	schema, events, pending string
	// backfill hands every unpublished log row to the polling half: those
	// the pending set lacks (written before the slot existed, or held by
	// a slot that was invalidated, or by a stream that stopped for good)
	// and those a polling Writer wrote there. It scans the log (no index
	// serves published_at IS NULL), which is why it runs only at setup,
	// recovery and teardown.
	backfill string
	// lockLanes locks the lanes of a stream batch's keys ($1), waiting for
	// a batch of the polling half that holds one: from the look at the
	// pending set to the marks, no batch of the polling half publishes an
	// event of those keys (a replay of one of them, say, cannot interleave
	// with the stream's new events of it). In lane order: the polling
	// half never waits for a lane (SKIP LOCKED), so this cannot deadlock.
	lockLanes string
	// heldKeys says which keys of a stream batch ($1) have events handed
	// to the pending set: those keys' stream events go there too, behind
	// them, so per-key order holds. It scans the pending set, empty or
	// small while everything flows (a large replay makes it slower, not
	// wrong). Its keys stay a plain parameter, planned for each batch: the
	// scan then hashes them, where an InitPlan's array (sqlident.AnyParam)
	// would be matched one key after another against each pending row.
	heldKeys string
	// visible counts the events of a batch ($1) that this statement sees,
	// and returns those that need nothing more: marked published already,
	// discarded, or dead-lettered. The stream repeats what it delivered
	// after its last confirmed position (a relay killed, a server
	// restarted, a slot position saved at a checkpoint before it); such an
	// event is not published again, and a discarded dead letter never is.
	// And it delivers a transaction a moment before others see it: see
	// routeVisible (primary-key lookups).
	// visibleIDs returns the ids it sees.
	visible, visibleIDs string
	// divert hands stream events to the polling half (a row a polling
	// Writer wrote is handed over). One already published (a stream read
	// again after a crash) is not handed over.
	divert string
	// unclaim records failed stream events in the pending set
	// (unclaimSQL, streamed).
	unclaim string
	// mark marks what the stream published: a HOT update of the log by
	// primary key, as the polling relay's, and the removal of the pending
	// rows polling Writers wrote for them.
	mark string
}

func newCDCSQL(schema string) cdcSQL {
	events, pending := sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending")
	lanes := sqlident.Table(schema, "outbox_lane")
	ids := sqlident.AnyParam("$1", "int8")
	return cdcSQL{
		schema: schema, events: events, pending: pending,
		backfill: fmt.Sprintf(`INSERT INTO %[1]s AS p (id, lane, partition_key, next_attempt_at)
SELECT id, lane, partition_key, now() FROM %[2]s WHERE published_at IS NULL AND discarded_at IS NULL
ON CONFLICT (id) DO UPDATE SET next_attempt_at = now() WHERE p.next_attempt_at IS NULL`, pending, events),
		lockLanes: fmt.Sprintf(`SELECT lane FROM %s WHERE lane = ANY($1::smallint[]) ORDER BY lane FOR NO KEY UPDATE`, lanes),
		heldKeys:  fmt.Sprintf(`SELECT DISTINCT partition_key FROM %s WHERE partition_key = ANY($1) AND next_attempt_at IS NOT NULL`, pending),
		visible: fmt.Sprintf(`SELECT count(*), coalesce(array_agg(id) FILTER (WHERE published_at IS NOT NULL OR discarded_at IS NOT NULL OR dead_at IS NOT NULL), '{}')
  FROM %s WHERE id = %s`, events, ids),
		visibleIDs: fmt.Sprintf(`SELECT coalesce(array_agg(id), '{}') FROM %s WHERE id = %s`, events, ids),
		divert: fmt.Sprintf(`INSERT INTO %[1]s AS p (id, lane, partition_key, next_attempt_at)
SELECT id, lane, partition_key, now() FROM %[2]s WHERE id = %[3]s AND published_at IS NULL AND discarded_at IS NULL
ON CONFLICT (id) DO UPDATE SET next_attempt_at = now() WHERE p.next_attempt_at IS NULL`, pending, events, ids),
		unclaim: unclaimSQL(pending, events, true),
		mark: fmt.Sprintf(`WITH m AS (
    UPDATE %[1]s SET published_at = now() WHERE id = %[3]s AND published_at IS NULL
)
DELETE FROM %[2]s WHERE id = %[3]s AND next_attempt_at IS NULL`, events, pending, ids),
	}
}
