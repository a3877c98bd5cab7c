package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// Dead letters in bulk: the dry run counts and lists what a query selects
// (topic, error match, age) and changes nothing; RequeueMatching and
// DiscardMatching act on exactly those and count them.
func TestDeadLettersInBulk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	orders := opstest.OutboxDead(t, db, "orders", 3)
	opstest.OutboxDead(t, db, "billing", 2)
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	dead := func() int64 {
		t.Helper()
		s, err := admin.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s.Dead
	}
	refusal := "%" + opstest.Refusal + "%"
	for _, c := range []struct {
		q    core.DeadLetterQuery
		want int
	}{
		{core.DeadLetterQuery{Topic: "orders"}, 3},
		{core.DeadLetterQuery{Error: refusal}, 5},
		{core.DeadLetterQuery{Topic: "billing", Error: refusal}, 2},
		{core.DeadLetterQuery{Error: "%no such error%"}, 0},
		{core.DeadLetterQuery{DeadBefore: time.Now().Add(-time.Hour)}, 0},
		{core.DeadLetterQuery{DeadBefore: time.Now().Add(time.Hour)}, 5},
	} {
		d, err := admin.DryRun(ctx, c.q, 2)
		if err != nil {
			t.Fatal(err)
		}
		if d.Count != c.want || len(d.First) != min(2, c.want) {
			t.Errorf("dry run %+v: %d, first %d; want %d", c.q, d.Count, len(d.First), c.want)
		}
	}
	if d, _ := admin.DryRun(ctx, core.DeadLetterQuery{Topic: "orders"}, 0); d.First[0].EventID != orders[0] {
		t.Errorf("dry run lists %s first, want %s", d.First[0].EventID, orders[0])
	}
	if n := dead(); n != 5 {
		t.Fatalf("the dry runs changed the dead letters: %d", n)
	}
	if n, err := admin.RequeueMatching(ctx, core.DeadLetterQuery{Topic: "orders", Error: refusal}, opsActor); err != nil || n != 3 {
		t.Fatalf("requeue matching: %d, %v; want 3", n, err)
	}
	if n := dead(); n != 2 {
		t.Errorf("after requeueing orders: %d dead, want 2", n)
	}
	if n, err := admin.DiscardMatching(ctx, core.DeadLetterQuery{Error: "%"}, opsActor); err != nil || n != 2 {
		t.Fatalf("discard matching: %d, %v; want 2", n, err)
	}
	if n := dead(); n != 0 {
		t.Errorf("after discarding the rest: %d dead, want 0", n)
	}
}
