package retention

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// statements are a Cleaner's SQL on one schema, built once by New. Each
// removes one batch and is its own short transaction.
type statements struct {
	// events removes up to $2 events of the outbox log published or
	// discarded before $1, oldest first from created_at $3, and returns how
	// many and the last one's created_at (where the next batch starts).
	//
	// published_at and discarded_at are never before created_at, so
	// "created_at < cutoff" is implied by the rest: it lets the oldest rows
	// be found on outbox_event_created_at_idx, in order, from the point
	// where the previous batch of the pass stopped, so old rows that must
	// stay (a backlog older than the window) are passed over once per pass,
	// not once per batch. SKIP LOCKED leaves rows another Cleaner or a relay
	// holds for the next pass; the pending check keeps events queued for
	// replay (and those not yet published, dead or not).
	events string

	// marks removes up to $2 dedup marks processed before $1, on
	// processed_event_processed_at_idx (BRIN).
	marks string

	// inbox removes up to $2 inbox rows processed before $1, on
	// inbox_event_processed_at_idx. Rows not yet processed stay.
	inbox string

	// barrier removes the rows of the sagas among up to $2 old barrier rows
	// (before $1, on compensation_barrier_updated_at_idx, BRIN) none of
	// whose rows was reached since $1 (the primary key's saga_id prefix),
	// all of a saga's rows together. The DELETE checks updated_at again: a
	// row a command reached meanwhile stays. It returns the rows found and
	// the rows removed.
	barrier string

	// sagas removes up to $6 sagas in status $1 that ended before $4,
	// after the point where the previous batch stopped (($2, $3): the sagas
	// before it were removed, or kept for a stuck episode, or locked by
	// another Cleaner), found in order on saga_instance_ended_idx (status,
	// ended_at, id), and locked; then their history (saga_history_saga_idx),
	// their stored events (saga_event_once, (saga_id, event_id)) and their
	// rows. A saga with a stuck line in its history (found on
	// saga_history_stuck_idx, which holds only those lines) stays unless it
	// also ended before $5. FOR UPDATE checks the status again on a row
	// changed meanwhile. A child saga (parent set) stays while its parent
	// is there: the parent may still compensate it (on the primary key).
	// Their keys and attributes go with them (saga_attr's primary key).
	// It returns the sagas removed and the last one's (ended_at, id).
	sagas string

	// orphanEvents removes up to $2 events sent by key that no saga held
	// (saga_id '', on saga_event_once's prefix), stored before $1.
	orphanEvents string

	// bulkItems removes up to $2 records of bulk operations created before
	// $1, found on the records' primary key (operation_id, saga_id); bulk
	// then the operations created before $1 left without any record.
	bulkItems, bulk string

	// audit removes up to $2 audit trail entries recorded before $1,
	// oldest first, on audit_log_at_idx.
	audit string
}

func newStatements(schema string) statements {
	t := func(name string) string { return sqlident.Table(schema, name) }
	return statements{
		events: fmt.Sprintf(`WITH del AS (
    DELETE FROM %[1]s
     WHERE id IN (
        SELECT e.id FROM %[1]s e
         WHERE e.created_at < $1 AND e.created_at >= $3
           AND (e.published_at < $1 OR e.discarded_at < $1)
           AND NOT EXISTS (SELECT 1 FROM %[2]s p WHERE p.id = e.id)
         ORDER BY e.created_at
         LIMIT $2
           FOR UPDATE SKIP LOCKED)
    RETURNING created_at
)
SELECT count(*), max(created_at) FROM del`, t("outbox_event"), t("outbox_pending")),

		marks: fmt.Sprintf(`DELETE FROM %[1]s WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM %[1]s WHERE processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, t("processed_event")),

		inbox: fmt.Sprintf(`DELETE FROM %[1]s WHERE id = ANY(ARRAY(
    SELECT id FROM %[1]s WHERE processed AND processed_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, t("inbox_event")),

		barrier: fmt.Sprintf(`WITH old AS (
    SELECT o.saga_id FROM %[1]s o
     WHERE o.updated_at < $1
       AND NOT EXISTS (SELECT 1 FROM %[1]s n WHERE n.saga_id = o.saga_id AND n.updated_at >= $1)
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), del AS (
    DELETE FROM %[1]s b WHERE b.saga_id IN (SELECT saga_id FROM old) AND b.updated_at < $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM old), (SELECT count(*) FROM del)`, t("compensation_barrier")),

		sagas: fmt.Sprintf(`WITH old AS (
    SELECT s.id, s.ended_at FROM %[1]s s
     WHERE s.status = $1 AND s.ended_at IS NOT NULL
       AND (s.ended_at, s.id) > ($2::timestamptz, $3::text)
       AND s.ended_at < $4
       AND (s.ended_at < $5
            OR NOT EXISTS (SELECT 1 FROM %[2]s h WHERE h.saga_id = s.id AND (h.event = 'stuck' OR h.status = 'stuck')))
       AND (s.parent = '' OR NOT EXISTS (SELECT 1 FROM %[1]s p WHERE p.id = s.parent))
     ORDER BY s.ended_at, s.id
     LIMIT $6
       FOR UPDATE SKIP LOCKED
), h AS (
    DELETE FROM %[2]s WHERE saga_id IN (SELECT id FROM old)
), e AS (
    DELETE FROM %[3]s WHERE saga_id IN (SELECT id FROM old)
), a AS (
    DELETE FROM %[4]s WHERE saga_id IN (SELECT id FROM old)
), s AS (
    DELETE FROM %[1]s WHERE id IN (SELECT id FROM old) RETURNING id
), last AS (
    SELECT ended_at, id FROM old ORDER BY ended_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM s), (SELECT ended_at FROM last), coalesce((SELECT id FROM last), '')`,
			t("saga_instance"), t("saga_history"), t("saga_event"), t("saga_attr")),

		orphanEvents: fmt.Sprintf(`DELETE FROM %[1]s WHERE arrived = ANY(ARRAY(
    SELECT arrived FROM %[1]s WHERE saga_id = '' AND at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, t("saga_event")),

		bulkItems: fmt.Sprintf(`DELETE FROM %[1]s WHERE (operation_id, saga_id) IN (
    SELECT i.operation_id, i.saga_id FROM %[1]s i JOIN %[2]s o ON o.id = i.operation_id
     WHERE o.created_at < $1 LIMIT $2)`, t("saga_bulk_item"), t("saga_bulk_operation")),

		bulk: fmt.Sprintf(`DELETE FROM %[2]s o WHERE o.created_at < $1
   AND NOT EXISTS (SELECT 1 FROM %[1]s i WHERE i.operation_id = o.id)`, t("saga_bulk_item"), t("saga_bulk_operation")),

		audit: fmt.Sprintf(`DELETE FROM %[1]s WHERE id = ANY(ARRAY(
    SELECT id FROM %[1]s WHERE at < $1 ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED))`, t("audit_log")),
	}
}
