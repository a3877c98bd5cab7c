package outbox

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// adminSQL are the statements of the outbox's Admin on one schema, built
// once (newAdminSQL).
type adminSQL struct {
	listDead, requeue, discard, replay, stats string
	// requeueRows and discardRows act on row ids (bulk.go).
	requeueRows, discardRows string
	// notify wakes the relays ($1 the channel).
	notify string
}

func newAdminSQL(schema string) adminSQL {
	pending, events := sqlident.Table(schema, "outbox_pending"), sqlident.Table(schema, "outbox_event")
	return adminSQL{
		listDead: listDeadSQL(pending, events),
		requeue:  requeueSQL(pending, events),
		discard:  discardSQL(pending, events),
		replay:   replaySQL(pending, events),
		stats:    statsSQL(pending, events),
		notify:   `SELECT pg_notify($1, '')`,

		requeueRows: requeueRowsSQL(pending, events),
		discardRows: discardRowsSQL(pending, events),
	}
}

// listDeadSQL lists dead letters, a page at a time.
//
// Dead rows are always blocked too, so "p.blocked" lets the planner use
// the small partial index outbox_pending_blocked_idx instead of
// scanning the whole pending set.
func listDeadSQL(pending, events string) string {
	return fmt.Sprintf(`SELECT e.id, e.event_id::text, e.topic, e.partition_key, e.aggregate_type, e.aggregate_id,
       e.event_type, e.attempts, coalesce(e.last_error, ''), e.created_at, e.dead_at,
       coalesce(convert_to(e.payload::text, 'UTF8'), e.payload_bytes), e.payload IS NULL, e.headers
  FROM %[1]s p JOIN %[2]s e ON e.id = p.id
 WHERE p.blocked AND p.dead AND p.id > $1
   AND ($2 = '' OR e.topic = $2)
   AND ($3 = '' OR p.partition_key = $3)
 ORDER BY p.id
 LIMIT $4`, pending, events)
}

// requeueSQL makes dead letters ($1, event ids) pending again, due at once
// (next_attempt_at now, so that a CDC relay's polling half takes them: see
// claimable).
//
// Requeue and discard find the rows by event_id (its unique index),
// then the pending row by primary key. The "p.dead" condition is
// rechecked on the locked row, so a dead letter requeued and discarded
// at the same time ends up in exactly one of the two. They return what
// they acted on, for the audit trail.
func requeueSQL(pending, events string) string {
	return fmt.Sprintf(`WITH pend AS (
    UPDATE %[1]s p SET dead = false, blocked = false, next_attempt_at = now()
      FROM %[2]s e
     WHERE e.event_id = ANY($1::uuid[]) AND p.id = e.id AND p.dead
    RETURNING p.id
)
UPDATE %[2]s e SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
  FROM pend WHERE e.id = pend.id
RETURNING e.event_id::text, e.topic`, pending, events)
}

// discardSQL drops dead letters ($1, event ids) for good (see requeueSQL).
func discardSQL(pending, events string) string {
	return fmt.Sprintf(`WITH pend AS (
    DELETE FROM %[1]s p
     USING %[2]s e
     WHERE e.event_id = ANY($1::uuid[]) AND p.id = e.id AND p.dead
    RETURNING p.id
)
UPDATE %[2]s e SET discarded_at = now()
  FROM pend WHERE e.id = pend.id
RETURNING e.event_id::text, e.topic`, pending, events)
}

// requeueRowsSQL is requeueSQL of the dead letters with the given row ids
// ($1): the rows a bulk action selected, on the pending set's primary key.
// One event id can be a dead letter in several topics (a fan-out); only
// the rows selected are acted on.
func requeueRowsSQL(pending, events string) string {
	return fmt.Sprintf(`WITH pend AS (
    UPDATE %[1]s p SET dead = false, blocked = false, next_attempt_at = now()
     WHERE p.id = ANY($1::bigint[]) AND p.dead
    RETURNING p.id
)
UPDATE %[2]s e SET dead_at = NULL, attempts = 0, next_attempt_at = NULL
  FROM pend WHERE e.id = pend.id
RETURNING e.event_id::text, e.topic`, pending, events)
}

// discardRowsSQL is discardSQL of the dead letters with the given row ids
// ($1), as requeueRowsSQL.
func discardRowsSQL(pending, events string) string {
	return fmt.Sprintf(`WITH pend AS (
    DELETE FROM %[1]s p
     WHERE p.id = ANY($1::bigint[]) AND p.dead
    RETURNING p.id
)
UPDATE %[2]s e SET discarded_at = now()
  FROM pend WHERE e.id = pend.id
RETURNING e.event_id::text, e.topic`, pending, events)
}

// replaySQL puts a chunk of published events back into the pending set,
// due at once (next_attempt_at now: see claimable).
//
// Replay walks the log in id order (primary key), a chunk at a time.
// FOR KEY SHARE keeps a Cleaner from deleting a selected row before the
// pending row that points to it commits (it does not block the relay's
// mark, a non-key update).
// The filter's fields are parameters; an unset one ($n IS NULL or empty)
// matches everything. A time range alone is served by
// outbox_event_created_at_idx when the planner finds it selective.
func replaySQL(pending, events string) string {
	return fmt.Sprintf(`WITH sel AS (
    SELECT id, lane, partition_key
      FROM %[2]s
     WHERE id > $1 AND id <= $2
       AND published_at IS NOT NULL
       AND ($3::timestamptz IS NULL OR created_at >= $3)
       AND ($4::timestamptz IS NULL OR created_at < $4)
       AND ($5 = '' OR aggregate_type = $5)
       AND ($6 = '' OR aggregate_id = $6)
       AND ($7 = '' OR event_type = $7)
       AND ($8 = '' OR topic = $8)
       AND ($10 = '' OR partition_key = $10)
     ORDER BY id
     LIMIT $9
       FOR KEY SHARE
), ins AS (
    INSERT INTO %[1]s (id, lane, partition_key, next_attempt_at)
    SELECT id, lane, partition_key, now() FROM sel
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT (SELECT max(id) FROM sel), (SELECT count(*) FROM sel), (SELECT count(*) FROM ins)`, pending, events)
}

// statsSQL reports the size of the backlog.
//
// One round trip. The exact count stops at the limit; the oldest
// pending event is the first not-dead entry of the pending primary key
// and then a primary-key lookup in the log.
func statsSQL(pending, events string) string {
	return fmt.Sprintf(`SELECT
    (SELECT count(*) FROM (SELECT 1 FROM %[1]s WHERE NOT dead LIMIT $1) s),
    (SELECT count(*) FROM %[1]s WHERE blocked AND dead),
    (SELECT count(*) FROM %[1]s WHERE blocked AND NOT dead),
    (SELECT reltuples::bigint FROM pg_class WHERE oid = $2::text::regclass),
    (SELECT extract(epoch FROM now() - e.created_at)::float8 FROM %[2]s e
      WHERE e.id = (SELECT id FROM %[1]s WHERE NOT dead ORDER BY id LIMIT 1))`, pending, events)
}
