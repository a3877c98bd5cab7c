package outbox

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// cdcSQL are the statements of the CDC relay and of CDC's setup, recovery
// and status, on one schema, built once (newCDCSQL).
type cdcSQL struct {
	schema, events, pending string
	// backfill puts every unpublished log row the pending set lacks into
	// it: the events the stream will not deliver (written before the slot
	// existed, or held by a slot that was invalidated) go out through the
	// polling path. It scans the log (no index serves published_at IS
	// NULL), which is why it runs only at setup and recovery.
	backfill string
	// heldKeys says which keys of a stream batch have events in the
	// pending set: those keys' stream events go there too, behind them,
	// so per-key order holds. It scans the pending set, empty or small
	// while everything flows (a large replay makes it slower, not wrong).
	// Its keys stay a plain parameter, planned for each batch: the scan
	// then hashes them, where an InitPlan's array (sqlident.AnyParam)
	// would be matched one key after another against each pending row.
	heldKeys string
	// divert hands stream events to the polling half. One already
	// published (a stream read again after a crash) is not handed over
	// twice.
	divert string
	// unclaim is the polling relay's, for events that never were claimed
	// (unclaimSQL, streamed).
	unclaim string
	// marked says which events of a batch are marked published already
	// (primary-key lookups), while the stream may repeat what a relay
	// before published. mark is the mark: a HOT update of the log by
	// primary key, as the polling relay's; the publication streams
	// inserts only.
	marked, mark string
}

func newCDCSQL(schema string) cdcSQL {
	events, pending := sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending")
	ids := sqlident.AnyParam("$1", "int8")
	return cdcSQL{
		schema: schema, events: events, pending: pending,
		backfill: fmt.Sprintf(`INSERT INTO %s (id, lane, partition_key)
SELECT id, lane, partition_key FROM %s WHERE published_at IS NULL AND discarded_at IS NULL
ON CONFLICT (id) DO NOTHING`, pending, events),
		heldKeys: fmt.Sprintf(`SELECT DISTINCT partition_key FROM %s WHERE partition_key = ANY($1)`, pending),
		divert: fmt.Sprintf(`INSERT INTO %s (id, lane, partition_key)
SELECT id, lane, partition_key FROM %s WHERE id = %s AND published_at IS NULL AND discarded_at IS NULL
ON CONFLICT (id) DO NOTHING`, pending, events, ids),
		unclaim: unclaimSQL(pending, events, true),
		marked:  fmt.Sprintf(`SELECT id FROM %s WHERE id = %s AND published_at IS NOT NULL`, events, ids),
		mark:    fmt.Sprintf(`UPDATE %s SET published_at = now() WHERE id = %s AND published_at IS NULL`, events, ids),
	}
}
