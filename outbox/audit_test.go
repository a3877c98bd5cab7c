package outbox_test

import (
	"errors"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/outbox"
)

func (b *opsBundle) audited(f audit.Filter) []audit.Record {
	b.t.Helper()
	list, err := audit.New(b.db.Schema).List(b.ctx, b.db.Pool, f)
	if err != nil {
		b.t.Fatal(err)
	}
	return list
}

// Every dead letter requeued or discarded, one by one or in bulk, and
// every replay, is in the audit trail with who, why and from where,
// written in the action's transaction: rolled back with it, and never
// for a dead letter the call did not act on. An action without an
// operator or a reason is refused before anything changes.
func TestDeadLetterActionsAreAudited(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	ids := b.write(opsEvent("orders", "a"), opsEvent("orders", "b"), opsEvent("payments", "c"), opsEvent("orders", "d"))
	for _, id := range ids {
		b.fail(id, "boom", 10, true)
	}
	alice := core.Actor{Operator: "alice", Reason: "topic created", From: "cli alice@host"}

	for _, by := range []core.Actor{{}, {Operator: "alice"}, {Reason: "why"}} {
		if n, err := b.admin.Requeue(b.ctx, by, ids[0]); n != 0 || !errors.Is(err, core.ErrNoActor) {
			t.Errorf("Requeue by %+v = %d, %v; want core.ErrNoActor", by, n, err)
		}
		if n, err := b.admin.DiscardMatching(b.ctx, core.DeadLetterQuery{Error: "%"}, by); n != 0 || !errors.Is(err, core.ErrNoActor) {
			t.Errorf("DiscardMatching by %+v = %d, %v; want core.ErrNoActor", by, n, err)
		}
		if n, err := b.admin.Replay(b.ctx, outbox.ReplayFilter{All: true}, by); n != 0 || !errors.Is(err, core.ErrNoActor) {
			t.Errorf("Replay by %+v = %d, %v; want core.ErrNoActor", by, n, err)
		}
	}
	if s, _ := b.admin.Stats(b.ctx); s.Dead != 4 {
		t.Fatalf("refused actions changed the dead letters: %+v", s)
	}

	// In a transaction rolled back: no entry.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.admin.RequeueTx(b.ctx, tx, alice, ids[0]); err != nil || n != 1 {
		t.Fatalf("RequeueTx = %d, %v", n, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.audited(audit.Filter{}); len(got) != 0 {
		t.Fatalf("a rolled-back requeue left audit entries: %+v", got)
	}

	unknown := "0190aaaa-0000-7000-8000-000000000000"
	if n, err := b.admin.Requeue(b.ctx, alice, ids[0], unknown); err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v", n, err)
	}
	bob := core.Actor{Operator: "bob", Reason: "obsolete"}
	if n, err := b.admin.DiscardMatching(b.ctx, core.DeadLetterQuery{Topic: "orders"}, bob); err != nil || n != 2 {
		t.Fatalf("DiscardMatching = %d, %v", n, err)
	}
	got := b.audited(audit.Filter{})
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3 (one requeue, two discards): %+v", len(got), got)
	}
	requeued := got[2]
	if requeued.Operator != "alice" || requeued.Reason != "topic created" || requeued.Source != "cli alice@host" ||
		requeued.Action != "outbox.requeue" || requeued.Kind != audit.KindOutbox || requeued.Target != ids[0] || requeued.Scope != "orders" ||
		string(requeued.Before) != `{"state": "dead"}` || string(requeued.After) != `{"state": "pending"}` {
		t.Errorf("the requeue's entry: %+v", requeued)
	}
	for _, e := range got[:2] {
		if e.Operator != "bob" || e.Action != "outbox.discard" || (e.Target != ids[1] && e.Target != ids[3]) || string(e.After) != `{"state": "discarded"}` {
			t.Errorf("a discard's entry: %+v", e)
		}
	}
	if n, err := b.admin.Replay(b.ctx, outbox.ReplayFilter{Topic: "nothing-here"}, alice); err != nil || n != 0 {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	if e := b.audited(audit.Filter{Action: "outbox.replay"}); len(e) != 1 || e[0].Operator != "alice" || e[0].Scope != "nothing-here" {
		t.Errorf("the replay's entry: %+v", e)
	}
}
