package saga

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// statements are the SQL of the orchestrator on one schema: every
// statement, built once by newStatements, with the index it relies on said
// where it matters.
type statements struct {
	insert, history, claim, selectExisting          string
	historyFenced                                   string
	get, historyOf                                  string
	lockMany, updateMany                            string
	insertStarted                                   string
	request, claimRequests, clearRequest            string // operator.go
	failuresInARow, postpone, park, unregistered    string // timer.go
	compensateReason                                string // admin.go
	pause, unpause, hold, takeHeld, insertScheduled string // pause.go, schedule.go
	instance, historyTable                          string
	events                                          eventStatements // await.go
	bulk                                            bulkStatements  // bulk.go
	setParent, statusOf                             string          // child.go
	attr                                            attrStatements  // attr.go
}

// Every lock the orchestrator takes on a saga's row is FOR NO KEY UPDATE
// (it never changes the id): orchestrators exclude each other, and a
// signaller's FOR KEY SHARE (events.peek) never waits for one.
const instanceCols = `id, type, def_version, status, phase, step, steps, data, input, version,
       next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at, ended_at, operator_request, parent`

func newStatements(schema string) statements {
	s := baseStatements(schema)
	batchStatements(schema, &s)
	timerStatements(schema, &s)
	pauseStatements(schema, &s)
	scheduleStatements(schema, &s)
	s.events = newEventStatements(schema)
	s.setParent = fmt.Sprintf(`UPDATE %s SET parent = $2 WHERE id = $1`, s.instance)
	s.statusOf = fmt.Sprintf(`SELECT status FROM %s WHERE id = $1`, s.instance)
	s.bulk = newBulkStatements(schema)
	s.attr = newAttrStatements(schema)
	return s
}

func baseStatements(schema string) statements {
	inst, hist := sqlident.Table(schema, "saga_instance"), sqlident.Table(schema, "saga_history")
	return statements{
		instance: inst, historyTable: hist,
		insert: fmt.Sprintf(`INSERT INTO %s (id, type, def_version, status, phase, step, steps, data, input, version,
       next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at)
VALUES ($1, $2, $3, 'running', 'forward', '', '{}', $4, $4, 0, NULL, $5, 0, '', $6, $6)
ON CONFLICT (id) DO NOTHING`, inst),
		selectExisting: fmt.Sprintf(`SELECT type, def_version, input = $2::jsonb FROM %s WHERE id = $1`, inst),
		get:            fmt.Sprintf(`SELECT %s FROM %s WHERE id = $1`, instanceCols, inst),
		history: fmt.Sprintf(`INSERT INTO %s (saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail)
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[], $8::text[], $9::text[], $10::text[], $11::jsonb[])`, hist),
		// history, for rows that hold a fenced reply: a saga's first new
		// row, when it is the same fenced reply as the saga's last row
		// (same step, operation, attempt, outcome, status and reason),
		// adds its count to that row's detail instead of being inserted,
		// so duplicates of a reply leave one row, not one each. The last
		// row is found on saga_history_saga_idx (saga_id, id), backwards.
		// The saga's row is locked by the caller, so no other transaction
		// adds to its history meanwhile.
		historyFenced: fmt.Sprintf(`WITH input AS (
    SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[], $8::text[], $9::text[], $10::text[], $11::jsonb[])
           WITH ORDINALITY AS i(saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail, ord)
), head AS (
    SELECT DISTINCT ON (saga_id) * FROM input ORDER BY saga_id, ord
), merged AS (
    UPDATE %[1]s h
       SET detail = jsonb_build_object(
               'count', coalesce((h.detail->>'count')::bigint, 1) + coalesce((n.detail->>'count')::bigint, 1),
               'last_at', coalesce(n.detail->'last_at', to_jsonb(n.at)))
      FROM head n
     WHERE n.event = 'fenced'
       AND h.id = (SELECT max(l.id) FROM %[1]s l WHERE l.saga_id = n.saga_id)
       AND h.event = 'fenced' AND h.step = n.step AND h.operation = n.operation AND h.attempt = n.attempt
       AND h.outcome = n.outcome AND h.status = n.status AND h.reason = n.reason
    RETURNING n.ord
)
INSERT INTO %[1]s (saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail)
SELECT saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail
  FROM input WHERE ord NOT IN (SELECT ord FROM merged) ORDER BY ord`, hist),
		// A saga started without running a local step: its row in its first
		// state and its history in one round trip; the history only if the
		// row is new. Returns 1 if it is, 0 if the id existed.
		insertStarted: fmt.Sprintf(`WITH ins AS (
    INSERT INTO %[1]s (id, type, def_version, status, phase, step, steps, data, input, version,
           next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8, 1, $9, $10, $11, $12, $13, $13)
    ON CONFLICT (id) DO NOTHING
    RETURNING id
), h AS (
    INSERT INTO %[2]s (saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail)
    SELECT * FROM unnest($14::text[], $15::timestamptz[], $16::text[], $17::text[], $18::text[], $19::int[], $20::text[], $21::text[], $22::text[], $23::text[], $24::jsonb[])
     WHERE EXISTS (SELECT 1 FROM ins)
)
SELECT count(*) FROM ins`, inst, hist),
		// Relies on the partial index saga_instance_wakeup_idx. Only the
		// registered types and versions: others are another
		// orchestrator's (another service on the schema, another version
		// during a rolling deploy).
		claim: fmt.Sprintf(`SELECT %s FROM %s
 WHERE next_wakeup_at <= $1
   AND (type, def_version) IN (SELECT * FROM unnest($3::text[], $4::int[]))
 ORDER BY next_wakeup_at
 LIMIT $2
   FOR NO KEY UPDATE SKIP LOCKED`, instanceCols, inst),
		// Only these two write operator_request: saving a saga never does.
		request:      fmt.Sprintf(`UPDATE %s SET operator_request = $2, version = version + 1 WHERE id = $1 RETURNING version`, inst),
		clearRequest: fmt.Sprintf(`UPDATE %s SET operator_request = NULL WHERE id = $1`, inst),
		// Relies on the partial index saga_instance_operator_request_idx.
		claimRequests: fmt.Sprintf(`SELECT %s FROM %s
 WHERE operator_request IS NOT NULL
   AND (type, def_version) IN (SELECT * FROM unnest($1::text[], $2::int[]))
 LIMIT $3
   FOR NO KEY UPDATE SKIP LOCKED`, instanceCols, inst),
		historyOf: fmt.Sprintf(`SELECT id, saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail
  FROM %s WHERE saga_id = $1 ORDER BY id`, hist),
	}
}

func batchStatements(schema string, s *statements) {
	inst := sqlident.Table(schema, "saga_instance")
	// lockMany's array goes through an InitPlan (sqlident.AnyParam): with
	// "id = ANY($1)" PostgreSQL planned the lock again at every execution
	// (0.16 ms of planning per batch at 200 sagas/s, more than the lock
	// took to run).
	s.lockMany = fmt.Sprintf(`SELECT %s FROM %s WHERE id = %s ORDER BY id FOR NO KEY UPDATE`, instanceCols, inst, sqlident.AnyParam("$1", "text"))
	// updateMany writes the sagas' new states, and fails (a cast of its
	// message to int) unless it saved $13 rows: its check must stop a
	// COMMIT sent behind it in its round trip.
	//
	// It is an upsert that always takes its update path: the sagas are
	// locked in this transaction (lockMany), so each row is there. An
	// UPDATE ... FROM unnest(...) was planned again at every execution
	// (0.3 ms at a batch of a few sagas, as long as its execution), and its
	// join could be planned as a hash of a whole table; the upsert has one
	// plan, lookups in the primary key, which PostgreSQL keeps. A row it
	// would insert instead (only a bug could make one) comes back with
	// version 0, is not counted as saved, and fails the statement: nothing
	// is written.
	s.updateMany = fmt.Sprintf(`WITH saved AS (
INSERT INTO %s AS s (id, type, def_version, status, phase, step, steps, data, input, version,
       next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at, ended_at)
SELECT u.id, '', 0, u.status, u.phase, u.step, u.steps, u.data, '{}', 0,
       u.next_wakeup_at, u.deadline_at, u.attempts, u.last_error, u.updated_at, u.updated_at, u.ended_at
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]::jsonb[], $6::text[]::jsonb[], $7::timestamptz[],
              $8::timestamptz[], $9::int[], $10::text[], $11::timestamptz[], $12::timestamptz[])
       AS u(id, status, phase, step, steps, data, next_wakeup_at, deadline_at, attempts, last_error, updated_at, ended_at)
ON CONFLICT (id) DO UPDATE SET status = excluded.status, phase = excluded.phase, step = excluded.step, steps = excluded.steps,
       data = excluded.data, version = s.version + 1, next_wakeup_at = excluded.next_wakeup_at, deadline_at = excluded.deadline_at,
       attempts = excluded.attempts, last_error = excluded.last_error, updated_at = excluded.updated_at, ended_at = excluded.ended_at
RETURNING s.version)
SELECT CASE WHEN count(*) FILTER (WHERE version > 0) <> $13::int
            THEN ('saved ' || count(*) FILTER (WHERE version > 0) || ' of ' || $13::int || ' sagas')::int END FROM saved`, inst)
}

func timerStatements(schema string, s *statements) {
	inst, hist := sqlident.Table(schema, "saga_instance"), sqlident.Table(schema, "saga_history")
	// Relies on saga_history_saga_idx (saga_id, id).
	s.failuresInARow = fmt.Sprintf(`SELECT count(*) FROM %[1]s
 WHERE saga_id = $1 AND event = $2
   AND id > (SELECT coalesce(max(id), 0) FROM %[1]s
              WHERE saga_id = $1 AND event NOT IN ('timer_failed', 'operator_failed', 'fenced'))`, hist)
	// The sagas of a type on versions not registered ($2) that nothing
	// would move: live, scheduled, paused, or with an operator request
	// pending (ParkUnregistered).
	s.unregistered = fmt.Sprintf(`SELECT %s FROM %s
 WHERE type = $1 AND def_version <> ALL($2::int[])
   AND (status IN ('running', 'compensating', 'scheduled', 'paused') OR operator_request IS NOT NULL)
   FOR NO KEY UPDATE SKIP LOCKED`, instanceCols, inst)
	// Why the saga compensates: its last "compensate" line, on
	// saga_history_saga_idx (saga_id, id) backwards.
	s.compensateReason = fmt.Sprintf(`SELECT reason FROM %s WHERE saga_id = $1 AND event = 'compensate' ORDER BY id DESC LIMIT 1`, hist)
	s.postpone = fmt.Sprintf(`UPDATE %s SET next_wakeup_at = $2 WHERE id = $1`, inst)
	s.park = fmt.Sprintf(`UPDATE %s SET status = 'stuck', next_wakeup_at = NULL, last_error = $2, updated_at = $3,
       version = version + 1
 WHERE id = $1`, inst)
}

func pauseStatements(schema string, s *statements) {
	pause, held := sqlident.Table(schema, "saga_pause"), sqlident.Table(schema, "saga_held_reply")
	s.pause = fmt.Sprintf(`INSERT INTO %s (saga_id, paused_at, resume_status) VALUES ($1, $2, $3)
ON CONFLICT (saga_id) DO UPDATE SET paused_at = EXCLUDED.paused_at, resume_status = EXCLUDED.resume_status`, pause)
	s.unpause = fmt.Sprintf(`DELETE FROM %s WHERE saga_id = $1 RETURNING paused_at, resume_status`, pause)
	s.hold = fmt.Sprintf(`INSERT INTO %s (saga_id, at, event_id, step, operation, attempt, outcome, reason, payload)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, held)
	// Relies on saga_held_reply_saga_idx (saga_id, seq).
	s.takeHeld = fmt.Sprintf(`DELETE FROM %s WHERE saga_id = $1
RETURNING seq, event_id, step, operation, attempt, outcome, reason, payload`, held)
}

func scheduleStatements(schema string, s *statements) {
	s.insertScheduled = fmt.Sprintf(`INSERT INTO %s (id, type, def_version, status, phase, step, steps, data, input, version,
       next_wakeup_at, deadline_at, attempts, last_error, created_at, updated_at)
VALUES ($1, $2, $3, 'scheduled', 'forward', '', '{}', $4, $4, 1, $5, NULL, 0, '', $6, $6)
ON CONFLICT (id) DO NOTHING`, sqlident.Table(schema, "saga_instance"))
}

type eventStatements struct {
	insert, stateOf, tryLock, peek, open, nextNew, setState, closePending, claimNew string
	insertChild                                                                     string // child.go
}

func newEventStatements(schema string) eventStatements {
	inst, ev := sqlident.Table(schema, "saga_instance"), sqlident.Table(schema, "saga_event")
	return eventStatements{
		// A repeated event id of the same saga is a duplicate delivery:
		// the unique constraint saga_event_once keeps the first.
		insert: fmt.Sprintf(`INSERT INTO %s (saga_id, name, event_id, payload, state, at, key_type, key_name, key_value)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (saga_id, event_id) DO NOTHING
RETURNING arrived`, ev),
		stateOf: fmt.Sprintf(`SELECT state FROM %s WHERE saga_id = $1 AND event_id = $2`, ev),
		// The signaller takes the saga's row lock only if it is free: it
		// never waits for the orchestrator.
		tryLock: fmt.Sprintf(`SELECT %s FROM %s WHERE id = $1 FOR NO KEY UPDATE SKIP LOCKED`, instanceCols, inst),
		// When the row is locked, the signaller reads it under a key share
		// lock: never blocked by an orchestrator (which locks FOR NO KEY
		// UPDATE), it waits only for retention's removal of the saga (FOR
		// UPDATE), and then finds no row; while it holds it, retention
		// passes over the saga. So no event is stored without its saga.
		peek: fmt.Sprintf(`SELECT type, def_version, status FROM %s WHERE id = $1 FOR KEY SHARE`, inst),
		// An event between a parent and its child saga (child.go): stored
		// as new, whatever the saga's lock, for the timer pass.
		insertChild: fmt.Sprintf(`INSERT INTO %s (saga_id, name, event_id, payload, state, at, child) VALUES ($1, $2, $3, $4, 'new', $5, $6)
ON CONFLICT (saga_id, event_id) DO NOTHING`, ev),
		// On saga_event_open_idx (saga_id, arrived). A wait takes no
		// event between a parent and its child.
		open: fmt.Sprintf(`SELECT arrived, name, event_id, payload, state, at, child FROM %s
 WHERE saga_id = $1 AND state IN ('new', 'pending') AND name = ANY($2::text[]) AND child = ''
 ORDER BY arrived`, ev),
		nextNew: fmt.Sprintf(`SELECT arrived, name, event_id, payload, state, at, child FROM %s
 WHERE saga_id = $1 AND state = 'new'
 ORDER BY arrived LIMIT 1`, ev),
		setState:     fmt.Sprintf(`UPDATE %s SET state = $2, step = $3 WHERE arrived = $1`, ev),
		closePending: fmt.Sprintf(`UPDATE %s SET state = 'ignored' WHERE saga_id = %s AND state = 'pending'`, ev, sqlident.AnyParam("$1", "text")),
		// On saga_event_new_idx: only the events a signaller could not
		// apply (the saga was locked), a handful at any time. A saga whose
		// last pass failed (its last line but fenced ones is timer_failed,
		// found on saga_history_saga_idx backwards) waits for its backoff:
		// the timer pass takes it, new events first, when it is due.
		claimNew: fmt.Sprintf(`SELECT %s FROM %s s
 WHERE id IN (SELECT saga_id FROM %s WHERE state = 'new')
   AND status NOT IN ('paused', 'scheduled')
   AND (type, def_version) IN (SELECT * FROM unnest($1::text[], $2::int[]))
   AND (SELECT h.event FROM %s h WHERE h.saga_id = s.id AND h.event <> 'fenced' ORDER BY h.id DESC LIMIT 1) IS DISTINCT FROM 'timer_failed'
 LIMIT $3
   FOR NO KEY UPDATE SKIP LOCKED`, instanceCols, inst, ev, sqlident.Table(schema, "saga_history")),
	}
}

type bulkStatements struct {
	insertOp, setSelected, getOp, counts, pick, settle, setFiled, outcome, confirm string
}

func newBulkStatements(schema string) bulkStatements {
	op, item := sqlident.Table(schema, "saga_bulk_operation"), sqlident.Table(schema, "saga_bulk_item")
	return bulkStatements{
		insertOp: fmt.Sprintf(`INSERT INTO %s (id, action, operator, reason, query, created_at, selected)
VALUES ($1, $2, $3, $4, $5, $6, 0)`, op),
		setSelected: fmt.Sprintf(`UPDATE %s SET selected = $2 WHERE id = $1`, op),
		getOp:       fmt.Sprintf(`SELECT id, action, operator, reason, query, created_at, filed_at, selected, coalesce(confirmed_by, '') FROM %s WHERE id = $1`, op),
		// The first to confirm an operation is its confirmer.
		confirm: fmt.Sprintf(`UPDATE %s SET confirmed_by = coalesce(confirmed_by, $2) WHERE id = $1`, op),
		// An index-only scan of saga_bulk_item_state_idx on the operation.
		counts: fmt.Sprintf(`SELECT state, reason, count(*) FROM %s WHERE operation_id = $1 GROUP BY state, reason`, item),
		// The next selected items, in saga id order, on
		// saga_bulk_item_state_idx (operation_id, state, reason, saga_id).
		pick: fmt.Sprintf(`SELECT saga_id, revision FROM %s
 WHERE operation_id = $1 AND state = 'selected' AND reason = ''
 ORDER BY saga_id LIMIT $2
   FOR UPDATE SKIP LOCKED`, item),
		settle: fmt.Sprintf(`UPDATE %s i SET state = u.state, reason = u.reason, error = u.error, at = $2
  FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS u(saga_id, state, reason, error)
 WHERE i.operation_id = $1 AND i.saga_id = u.saga_id`, item),
		setFiled: fmt.Sprintf(`UPDATE %s o SET filed_at = $2 WHERE id = $1 AND filed_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM %s WHERE operation_id = $1 AND state = 'selected')`, op, item),
		// The orchestrator's outcome of a filed request: on the primary key.
		outcome: fmt.Sprintf(`UPDATE %s SET state = $3, reason = $4, error = $5, at = $6
 WHERE operation_id = $1 AND saga_id = $2 AND state = 'filed'`, item),
	}
}
