package compensation

import (
	"strings"
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
	plan := db.GenericPlan(t, newStatements(db.Schema).finishMany, 7)
	if !strings.Contains(plan, "Conflict Arbiter Indexes: compensation_barrier_pkey") || strings.Contains(plan, "Join") || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("the batch answers' generic plan:\n%s\nwant an upsert on compensation_barrier_pkey, with no join and no sequential scan", plan)
	}
}
