package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
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

// One event id in two topics (a fan-out), both dead letters with
// different errors: a bulk action acts on what its query selected, the
// copy of one topic whose error matches, never on the other topic's copy
// of the same id (the dry run and the action count alike), and an
// EventID with a Topic names one copy.
func TestDeadLettersInBulkActOnTheSelectedCopy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	var events []outbox.Event
	for _, topic := range []string{"orders", "audit"} {
		events = append(events, outbox.Event{ID: id, Topic: topic, PartitionKey: "order-1", Payload: []byte(`{"n":1}`)})
	}
	if _, err := w.Write(ctx, events...); err != nil {
		t.Fatal(err)
	}
	opstest.Relay(t, db, opstest.Refuse{}, func(s outbox.Stats) bool { return s.Dead == 2 })
	if _, err := db.Pool.Exec(ctx, `UPDATE `+sqlident.Table(db.Schema, "outbox_event")+` SET last_error = 'audit sink: schema mismatch' WHERE topic = 'audit'`); err != nil {
		t.Fatal(err)
	}
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	deadIn := func(topic string) int {
		t.Helper()
		l, err := admin.List(ctx, core.ListParams{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	q := core.DeadLetterQuery{Topic: "orders", Error: "%" + opstest.Refusal + "%"}
	d, err := admin.DryRun(ctx, q, 0)
	if err != nil || d.Count != 1 {
		t.Fatalf("dry run: %+v, %v", d, err)
	}
	if n, err := admin.DiscardMatching(ctx, q, opsActor); err != nil || n != 1 {
		t.Fatalf("discard matching: %d, %v; the dry run said 1", n, err)
	}
	if deadIn("orders") != 0 || deadIn("audit") != 1 {
		t.Fatalf("after discarding orders' copy: orders %d, audit %d dead", deadIn("orders"), deadIn("audit"))
	}

	// One copy by its id and topic (as the console's single action acts).
	for _, q := range []core.DeadLetterQuery{{Topic: "orders", EventID: id}, {Topic: "audit", EventID: uuid.NewString()}} {
		if n, err := admin.RequeueMatching(ctx, q, opsActor); err != nil || n != 0 {
			t.Fatalf("requeue %+v: %d, %v; want none", q, n, err)
		}
	}
	if n, err := admin.RequeueMatching(ctx, core.DeadLetterQuery{Topic: "audit", EventID: id}, opsActor); err != nil || n != 1 {
		t.Fatalf("requeue audit's copy: %d, %v", n, err)
	}
	if deadIn("audit") != 0 {
		t.Fatalf("audit's copy still dead")
	}
	if _, err := admin.DryRun(ctx, core.DeadLetterQuery{Error: `x\`}, 0); !errors.Is(err, core.ErrInvalidListParams) {
		t.Fatalf("a pattern LIKE refuses: %v", err)
	}
}
