package outbox

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// writerSQL are a Writer's statements on one schema, built once
// (newWriterSQL): they write one event, and many, each in one round trip;
// the ...Notify forms also send the wake-up hint ($11 the channel).
type writerSQL struct {
	insertOne, insertOneNotify, insert, insertNotify string
}

// eventColumns are the columns a Writer fills, in the order of its
// statements' parameters.
const eventColumns = `event_id, aggregate_type, aggregate_id, event_type, topic, partition_key, lane, payload, payload_bytes, headers`

// newWriterSQL builds the statements that write the log rows and their
// pending rows, and when due the wake-up hint; with cdc, the log row
// alone: the CDC relay streams the insert (and needs no hint).
func newWriterSQL(schema string, cdc bool) writerSQL {
	events, pending := sqlident.Table(schema, "outbox_event"), sqlident.Table(schema, "outbox_pending")
	if cdc {
		return writerSQL{
			insertOne: fmt.Sprintf(`INSERT INTO %s (%s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`, events, eventColumns),
			insert: fmt.Sprintf(`INSERT INTO %s (%s)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int2[], $8::text[]::json[], $9::bytea[], $10::text[]::jsonb[])`, events, eventColumns),
		}
	}
	many := fmt.Sprintf(`WITH ev AS (
    INSERT INTO %s (%s)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int2[], $8::text[]::json[], $9::bytea[], $10::text[]::jsonb[])
    RETURNING id, lane, partition_key
), p AS (
    INSERT INTO %s (id, lane, partition_key) SELECT id, lane, partition_key FROM ev
)`, events, eventColumns, pending)
	return writerSQL{
		insertOne: fmt.Sprintf(`WITH ev AS (
    INSERT INTO %s (%s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    RETURNING id, lane, partition_key
)
INSERT INTO %s (id, lane, partition_key) SELECT id, lane, partition_key FROM ev`, events, eventColumns, pending),
		insertOneNotify: fmt.Sprintf(`WITH ev AS (
    INSERT INTO %s (%s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    RETURNING id, lane, partition_key
), p AS (
    INSERT INTO %s (id, lane, partition_key) SELECT id, lane, partition_key FROM ev
)
SELECT pg_notify($11, '')`, events, eventColumns, pending),
		insert: many + `
SELECT 1`,
		insertNotify: many + `
SELECT pg_notify($11, '')`,
	}
}
