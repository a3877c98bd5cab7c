package compensation

import (
	"fmt"

	"github.com/millrace/millrace/internal/sqlident"
)

// The savepoint that separates the barrier's claim from the function's
// effects: a business failure rolls back to it, keeping the claim.
const (
	savepoint  = `SAVEPOINT millrace_compensation`
	rollbackTo = `ROLLBACK TO SAVEPOINT millrace_compensation`
	release    = `RELEASE SAVEPOINT millrace_compensation`
)

// statements are the barrier's SQL for one schema.
type statements struct {
	claimActions, claimCompensations, finishMany string
}

// newStatements builds the barrier statements. Every claim is an upsert on
// the primary key (saga_id, step, operation): an INSERT that meets a row
// another transaction is writing waits for that transaction to end, so the
// key decides atomically which of an action and its compensation came
// first; ON CONFLICT DO UPDATE locks the existing row and returns its
// newest committed version (DO NOTHING would return nothing, and a plain
// SELECT might not see a row committed after the statement began).
// "xmax = 0" tells an inserted row from an updated one; an updated row
// whose outcome is empty was claimed again (see reclaimFailure).
func newStatements(schema string) statements {
	t := sqlident.Table(schema, "compensation_barrier")
	return statements{
		// Many actions' rows, and the action rows of many compensations
		// (outcome cancelled, which counts no delivery), in the order given
		// (the caller sorts them, for a fixed lock order).
		claimActions:       claimMany(t, "action", "deliveries = b.deliveries + (excluded.outcome = '')::int, updated_at = now(), "+reclaimFailure),
		claimCompensations: claimMany(t, "compensation", "deliveries = b.deliveries + 1, updated_at = now()"),
		// Many answers: an upsert that always takes its update path, as
		// each row was claimed in this transaction. An UPDATE ... FROM
		// unnest(...) was planned again at every execution (0.2 ms at a
		// batch of a few commands, longer than it ran), and its join could
		// be planned as a hash of the whole table; the upsert has one plan,
		// lookups in the primary key, which PostgreSQL keeps. updated_at
		// keeps its value here too.
		finishMany: fmt.Sprintf(`INSERT INTO %s AS b (saga_id, step, operation, outcome, empty, reply, reason)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[], $6::bytea[], $7::text[])
ON CONFLICT (saga_id, step, operation) DO UPDATE SET outcome = excluded.outcome, empty = excluded.empty,
       reply = excluded.reply, reason = excluded.reason`, t),
	}
}

func claimMany(table, op, onConflict string) string {
	return fmt.Sprintf(`INSERT INTO %[1]s AS b (saga_id, step, operation, saga_type, command, outcome, reason, attempt)
SELECT u.saga_id, u.step, '%[2]s', u.saga_type, u.command, u.outcome, u.reason, u.attempt
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[]) WITH ORDINALITY
       AS u(saga_id, step, saga_type, command, outcome, reason, attempt, n)
 ORDER BY u.n
ON CONFLICT (saga_id, step, operation) DO UPDATE SET %[3]s
RETURNING b.saga_id, b.step, (b.xmax = 0 OR b.outcome = ''), b.outcome, b.reply, b.reason`, table, op, onConflict)
}

// reclaimFailure is the part of an action row's upsert that claims a
// business failure again. A failure promises no effect, so it is not
// final: a later attempt of the step (a higher attempt number than the one
// that failed) takes the row back (an empty outcome: it runs the action now),
// while the failed attempt itself and earlier ones, delivered again or
// late, get the stored failure. A compensation's upsert (its outcome is
// cancelled) turns the failure into cancelled, which blocks every later
// attempt of the action as when the compensation came first. The SET
// expressions read the row as it was.
const reclaimFailure = `outcome = CASE WHEN ` + reclaimable + ` THEN excluded.outcome ELSE b.outcome END,
    reason = CASE WHEN ` + reclaimable + ` THEN excluded.reason ELSE b.reason END,
    reply = CASE WHEN ` + reclaimable + ` THEN '\x'::bytea ELSE b.reply END,
    attempt = CASE WHEN ` + reclaimable + ` THEN excluded.attempt ELSE b.attempt END`

const reclaimable = `(b.outcome = 'failure' AND (excluded.outcome <> '' OR excluded.attempt > b.attempt))`
