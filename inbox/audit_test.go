package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/audit"
)

// Every inbox dead letter requeued or discarded, one by one or in bulk,
// is in the audit trail with the operator, the reason and the consumer,
// in the action's transaction; without an operator or a reason nothing
// changes.
func TestDeadLetterActionsAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	ctx := context.Background()
	r := newReceiver(t, b, "c")
	ms := msgs(3, nil)
	if _, err := r.Receive(ctx, ms...); err != nil {
		t.Fatal(err)
	}
	p := newProcessor(t, b, inbox.ProcessorConfig{Handler: func(context.Context, pgx.Tx, *message.Message) error {
		return core.Permanent(errors.New("no"))
	}})
	if _, err := p.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dl := p.DeadLetters()
	if n, err := dl.Discard(ctx, core.Actor{Operator: "alice"}, ms[0].UUID); n != 0 || !errors.Is(err, core.ErrNoActor) {
		t.Fatalf("Discard without a reason = %d, %v; want core.ErrNoActor", n, err)
	}
	if n, err := dl.RequeueMatching(ctx, core.DeadLetterQuery{Error: "%"}, core.Actor{Reason: "x"}); n != 0 || !errors.Is(err, core.ErrNoActor) {
		t.Fatalf("RequeueMatching without an operator = %d, %v; want core.ErrNoActor", n, err)
	}
	alice := core.Actor{Operator: "alice", Reason: "order cancelled"}
	if n, err := dl.Discard(ctx, alice, ms[0].UUID); err != nil || n != 1 {
		t.Fatalf("Discard = %d, %v", n, err)
	}
	if n, err := dl.RequeueMatching(ctx, core.DeadLetterQuery{Error: "%"}, core.Actor{Operator: "bob", Reason: "fixed"}); err != nil || n != 2 {
		t.Fatalf("RequeueMatching = %d, %v", n, err)
	}
	list, err := audit.New(b.db.Schema).List(ctx, b.db.Pool, audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Fatalf("%d entries, want 3: %+v", len(list), list)
	}
	if e := list[2]; e.Operator != "alice" || e.Reason != "order cancelled" || e.Action != "inbox.discard" || e.Kind != audit.KindInbox ||
		e.Scope != "c" || e.Target != ms[0].UUID || string(e.After) != `{"state": "discarded"}` {
		t.Errorf("the discard's entry: %+v", e)
	}
	for _, e := range list[:2] {
		if e.Operator != "bob" || e.Action != "inbox.requeue" || (e.Target != ms[1].UUID && e.Target != ms[2].UUID) {
			t.Errorf("a requeue's entry: %+v", e)
		}
	}
}
