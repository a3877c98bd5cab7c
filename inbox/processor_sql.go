package inbox

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// processorSQL are a Processor's statements on one schema, built once
// (newProcessorSQL).
type processorSQL struct {
	// claim takes a batch of due rows ($1 consumer, $2 BatchSize), with
	// for each whether an earlier row of its key is not in the batch
	// (always false without OrderByKey).
	claim string
	// markDone marks rows processed ($1 ids); markFailed records the
	// failures of rows (their attempts, errors, backoff, and whether they
	// are dead), of those not changed since they were claimed.
	markDone, markFailed string
}

func newProcessorSQL(schema string, orderByKey bool) processorSQL {
	table := sqlident.Table(schema, "inbox_event")
	s := processorSQL{
		claim: claimSQL(table),
		markDone: fmt.Sprintf(`UPDATE %s SET processed = true, processed_at = now(), next_attempt_at = NULL
 WHERE id = %s`, table, sqlident.AnyParam("$1", "int8")),
		markFailed: fmt.Sprintf(`UPDATE %s AS e SET attempts = f.attempts, last_error = f.err,
       next_attempt_at = now() + f.backoff_ms * interval '1 millisecond',
       dead_at = CASE WHEN f.dead THEN now() END
  FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::bool[]) AS f(id, attempts, err, backoff_ms, dead)
 WHERE e.id = f.id AND e.attempts = f.attempts - 1 AND NOT e.processed`, table),
	}
	if orderByKey {
		s.claim = claimByKeySQL(table)
	}
	return s
}

// claimSQL claims rows in any order. It walks
// inbox_event_unprocessed_idx (consumer, id).
func claimSQL(table string) string {
	return fmt.Sprintf(`SELECT id, event_id::text, topic, partition_key, payload, metadata::text, attempts, false
  FROM %s
 WHERE consumer = $1 AND NOT processed AND dead_at IS NULL
   AND (next_attempt_at IS NULL OR next_attempt_at <= now())
 ORDER BY id
 LIMIT $2
   FOR UPDATE SKIP LOCKED`, table)
}

// claimByKeySQL claims rows for OrderByKey. The per-key hold is decided
// twice.
//
// Before the LIMIT, so that held rows never fill the batch: a row is
// skipped when the first unprocessed row of its key (its head) is dead or
// backing off. The head is the first entry of its key in
// inbox_event_unprocessed_key_idx (consumer, partition_key, id): one index
// probe, which the planner caches per key (Memoize), so a long run of held
// rows costs a scan of inbox_event_unprocessed_idx and little more
// (measured: 100,000 held rows ahead of the batch, ~50 ms).
//
// After the claim, exactly: a claimed row is held when the unprocessed row
// just before it in its key (the last entry before it in the same index,
// one probe) is not in this batch: it is in another processor's batch
// (rows stay unprocessed until that batch commits), or waits between the
// head and this row. The processor then also holds the key's later rows of
// the batch, so every row it applies has all the earlier rows of its key
// applied, or applied before it in the same batch.
func claimByKeySQL(table string) string {
	return fmt.Sprintf(`WITH claimed AS (
SELECT q.id, q.event_id::text, q.topic, q.partition_key, q.payload, q.metadata::text, q.attempts
  FROM %[1]s q
  LEFT JOIN LATERAL (
        SELECT h.dead_at, h.next_attempt_at FROM %[1]s h
         WHERE h.consumer = $1 AND h.partition_key = q.partition_key
           AND NOT h.processed AND h.partition_key <> ''
         ORDER BY h.id LIMIT 1) head ON q.partition_key <> ''
 WHERE q.consumer = $1 AND NOT q.processed AND q.dead_at IS NULL
   AND (q.next_attempt_at IS NULL OR q.next_attempt_at <= now())
   AND head.dead_at IS NULL AND (head.next_attempt_at IS NULL OR head.next_attempt_at <= now())
 ORDER BY q.id
 LIMIT $2
   FOR UPDATE OF q SKIP LOCKED
)
SELECT c.*, c.partition_key <> '' AND EXISTS (
        SELECT 1 FROM (SELECT e.id FROM %[1]s e
                        WHERE e.consumer = $1 AND e.partition_key = c.partition_key
                          AND NOT e.processed AND e.partition_key <> '' AND e.id < c.id
                        ORDER BY e.id DESC LIMIT 1) prev
         WHERE prev.id NOT IN (SELECT id FROM claimed))
  FROM claimed c
 ORDER BY c.id`, table)
}
