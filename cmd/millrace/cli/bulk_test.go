package cli

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// A bulk retry through the stock binary, --json parsed back: the dry run
// counts and lists and changes nothing; the action records the operation
// and files a request on each selected saga; saga bulk status reads the
// outcome counts once the service's orchestrator has applied them.
func TestSagaBulkRetry(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ids := s.StuckRefunds(t, db, "refund", 1000)
	s.WaitingShip(t, "ship-1")
	sel := []string{"--status", "stuck", "--step", "reserve", "--error", "%no such reservation%"}

	var dry bulkDryRunJSON
	okJSON(t, db, &dry, append([]string{"saga", "retry", "--dry-run"}, sel...)...)
	if !dry.DryRun || dry.Count != 1000 || len(dry.Sagas) != 20 || dry.Sagas[0].ID != ids[999] || dry.Query.Step != "reserve" {
		t.Fatalf("dry run: %+v", dry)
	}
	if in := s.Get(t, ids[0]); in.Request != nil {
		t.Fatalf("the dry run filed a request: %+v", in.Request)
	}
	fails(t, db, 2, `--reason is required`, append([]string{"saga", "retry", "--by", "alice"}, sel...)...)
	fails(t, db, 2, `--by is required`, append([]string{"saga", "retry", "--reason", "x"}, sel...)...)
	fails(t, db, 2, `give a saga id, or select sagas`, "saga", "retry", "--by", "alice", "--reason", "x")
	fails(t, db, 2, `not both`, "saga", "retry", ids[0], "--reason", "x", "--status", "stuck")

	// One saga changes after the dry run: it is no longer selected.
	s.Fix.Store(true)
	if _, err := s.O.Retry(context.Background(), ids[0], saga.Actor{Operator: "bob", Reason: "one by hand"}); err != nil {
		t.Fatal(err)
	}
	var op saga.BulkOperation
	okJSON(t, db, &op, append([]string{"saga", "retry", "--by", "alice", "--reason", "stock service fixed"}, sel...)...)
	if op.ID == "" || op.Action != saga.ActionRetry || op.Operator != "alice" || op.Counts.Selected != 999 ||
		op.Counts.Filed != 999 || op.Counts.Pending != 999 || op.Filed == nil {
		t.Fatalf("bulk retry: %+v", op)
	}

	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := s.O.RunDue(context.Background()); err != nil {
			t.Fatal(err)
		}
		var st saga.BulkOperation
		okJSON(t, db, &st, "saga", "bulk", "status", op.ID)
		if st.Counts.Pending == 0 {
			if st.Counts.Applied != 999 || st.Counts.RefusedTotal() != 0 || st.Query.Error != "%no such reservation%" {
				t.Fatalf("bulk status once applied: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not applied in time: %+v", st.Counts)
		}
	}
	for _, id := range []string{ids[1], ids[500], ids[999]} {
		if in := s.Get(t, id); in.Status != saga.StatusCompensated {
			t.Errorf("saga %s is %s after the bulk retry", id, in.Status)
		}
	}
	fails(t, db, 1, `no such bulk operation`, "saga", "bulk", "status", "nope")
}

// Outbox dead letters in bulk through the CLI, --json parsed back.
func TestOutboxDeadBulk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	orders := opstest.OutboxDead(t, db, "orders", 3)
	opstest.OutboxDead(t, db, "billing", 2)
	var dry deadBulkJSON
	okJSON(t, db, &dry, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--topic", "orders", "--error", "%"+opstest.Refusal+"%", "--dry-run")
	if !dry.DryRun || dry.Count != 3 || len(dry.EventIDs) != 3 || dry.EventIDs[0] != orders[0] {
		t.Fatalf("dry run: %+v", dry)
	}
	if s := outboxStatsOf(t, db); s.Dead != 5 {
		t.Fatalf("the dry run changed the dead letters: %+v", s)
	}
	var done deadBulkJSON
	okJSON(t, db, &done, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--topic", "orders")
	if done.DryRun || done.Count != 3 {
		t.Fatalf("requeue: %+v", done)
	}
	okJSON(t, db, &done, "outbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--error", "%")
	if done.Count != 2 {
		t.Fatalf("discard: %+v", done)
	}
	if s := outboxStatsOf(t, db); s.Dead != 0 {
		t.Errorf("after the bulk actions: %+v", s)
	}
	fails(t, db, 2, `give event ids, or select`, "outbox", "dead", "requeue")
	fails(t, db, 2, `not both`, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", orders[0], "--topic", "orders")
}

// Inbox dead letters in bulk through the CLI, --json parsed back: the dry
// run counts and lists and changes nothing; the action applies to the
// consumer's dead letters the flags select, and no others.
func TestInboxDeadBulk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	ids := opstest.InboxDead(t, db, "billing", 3)
	other := opstest.InboxDead(t, db, "shipping", 1)
	if _, err := db.Pool.Exec(ctx, `UPDATE `+db.Schema+`.inbox_event SET last_error = 'handler: timeout' WHERE event_id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	dead := func(consumer string) []string {
		t.Helper()
		var list []inboxDeadLetter
		okJSON(t, db, &list, "inbox", "dead", "list", "--consumer", consumer)
		out := []string{}
		for _, d := range list {
			out = append(out, d.EventID)
		}
		return out
	}
	var dry deadBulkJSON
	okJSON(t, db, &dry, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", "--error", "%not found%", "--dry-run")
	if !dry.DryRun || dry.Count != 2 || dry.Consumer != "billing" || !slices.Equal(dry.EventIDs, []string{ids[0], ids[2]}) {
		t.Fatalf("dry run: %+v", dry)
	}
	if got := dead("billing"); len(got) != 3 {
		t.Fatalf("the dry run changed the dead letters: %v", got)
	}
	if out := ok(t, db, "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--consumer", "billing", "--older-than", "1h", "--dry-run"); out != "dry run: discard would apply to 0 inbox dead letters of consumer \"billing\"; nothing was changed. The first: \n" {
		t.Errorf("dry run printed %q", out)
	}
	var done deadBulkJSON
	okJSON(t, db, &done, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", "--error", "%not found%")
	if done.DryRun || done.Count != 2 || done.Action != "requeue" {
		t.Fatalf("requeue: %+v", done)
	}
	if got := dead("billing"); !slices.Equal(got, []string{ids[1]}) {
		t.Errorf("after the requeue, billing's dead letters are %v; want only %s", got, ids[1])
	}
	if out := ok(t, db, "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--consumer", "billing", "--error", "%timeout"); out != "discarded 1 inbox dead letters of consumer \"billing\"\n" {
		t.Errorf("discard printed %q", out)
	}
	if got := dead("billing"); len(got) != 0 {
		t.Errorf("after the discard, billing's dead letters are %v", got)
	}
	if got := dead("shipping"); !slices.Equal(got, other) {
		t.Errorf("shipping's dead letters changed: %v", got)
	}
	fails(t, db, 2, `give event ids, or select`, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing")
	fails(t, db, 2, `give event ids, or select`, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", "--dry-run")
	fails(t, db, 2, `not both`, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "shipping", other[0], "--error", "%")
	fails(t, db, 2, `--older-than must not be negative`, "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--consumer", "shipping", "--older-than", "-1h")
	fails(t, db, 2, `--consumer is required`, "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--error", "%")
}
