package compensation

import (
	"testing"

	"github.com/millrace/millrace/internal/pgtest"
)

// A batch's answers are written by a plan that is the same whatever the
// table holds: lookups in compensation_barrier's primary key, never a join
// the planner could make a hash of the whole table. A plan PostgreSQL
// keeps for a prepared statement is made once, on the table as it is then
// (here: new and empty), and kept while it grows.
func TestFinishManyPlanHasNoJoin(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 1})
	db.CheckUpsertPlan(t, newStatements(db.Schema).finishMany, 7, "compensation_barrier_pkey")
}
