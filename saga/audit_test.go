package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// auditOf returns the audit trail of one saga (or bulk operation), oldest
// first.
func auditOf(t *testing.T, db *pgtest.DB, f audit.Filter) []audit.Record {
	t.Helper()
	list, err := audit.New(db.Schema).List(context.Background(), db.Pool, f)
	if err != nil {
		t.Fatal(err)
	}
	for i, j := 0, len(list)-1; i < j; i, j = i+1, j-1 {
		list[i], list[j] = list[j], list[i]
	}
	return list
}

// stateOf decodes an audit entry's state.
func stateOf(t *testing.T, raw json.RawMessage) map[string]any {
	t.Helper()
	var s map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// An action that says which revision of the saga the operator looked at
// (Actor.Revision) is refused as stale, and changes nothing, when the
// saga moved on since: here a reply took it from credit to the next step
// between the operator's look and their Skip. The same goes for a
// request and for a withdrawal. With the revision as it is now, it acts.
func TestOperatorActsOnlyOnWhatTheySaw(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	p := newOperator(t, d)
	ctx := context.Background()
	id := "o-seen"
	start(t, d.testBundle, def, id, 1)
	looked := d.get(id)
	if looked.Step != "credit" {
		t.Fatalf("saga at %q, want credit", looked.Step)
	}
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit done: the saga moves on
	moved := d.get(id)
	if moved.Step == "credit" || moved.Revision == looked.Revision {
		t.Fatalf("the reply did not move the saga: %+v", moved)
	}

	by := saga.Actor{Operator: "alice", Reason: "done by hand", Revision: looked.Revision}
	if _, err := d.o.Skip(ctx, id, by); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("Skip of a step the operator never saw: %v, want refused as stale", err)
	}
	if _, err := p.Request(ctx, id, saga.ActionSkip, by); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("Request on a stale look: %v, want refused as stale", err)
	}
	if got := d.get(id); got.Revision != moved.Revision || got.Step != moved.Step || got.Request != nil {
		t.Fatalf("a stale action changed the saga: %+v", got)
	}
	if len(auditOf(t, d.db, audit.Filter{Target: id})) != 0 {
		t.Fatal("a refused action is in the audit trail")
	}

	// A request, then a withdrawal by someone who looked before it.
	by.Revision = moved.Revision
	in, err := p.Request(ctx, id, saga.ActionPause, by)
	if err != nil {
		t.Fatal(err)
	}
	stale := saga.Actor{Operator: "bob", Reason: "not now", Revision: moved.Revision}
	if _, err := p.Withdraw(ctx, id, stale); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("Withdraw of a request the operator never saw: %v, want refused as stale", err)
	}
	stale.Revision = in.Revision
	if _, err := p.Withdraw(ctx, id, stale); err != nil {
		t.Fatalf("Withdraw of the request seen: %v", err)
	}
	by.Revision = d.get(id).Revision
	if _, err := d.o.Pause(ctx, id, by); err != nil {
		t.Fatalf("Pause on what the operator saw: %v", err)
	}
}

// Every operator action lands in the audit trail, in its own transaction:
// who, why, from where, the action and its outcome, the saga's state
// before and after. A request is recorded when filed, and again when the
// orchestrator applies it (as its requester) or refuses it; a withdrawal
// too. An action the saga's state refuses leaves nothing.
func TestOperatorActionsAreAudited(t *testing.T) {
	t.Parallel()
	id := "o-audited"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()

	alice := saga.Actor{Operator: "alice", Reason: "participant fixed", From: "console 203.0.113.7"}
	if _, err := d.o.Skip(ctx, id, alice); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("Skip of a compensating saga: %v", err)
	}
	if _, err := d.o.Retry(ctx, id, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) || !errors.Is(err, core.ErrNoActor) {
		t.Fatalf("Retry without a reason: %v, want ErrActionNotAllowed and core.ErrNoActor", err)
	}
	if got := auditOf(t, d.db, audit.Filter{Target: id}); len(got) != 0 {
		t.Fatalf("refused actions are in the audit trail: %+v", got)
	}
	if _, err := d.o.Retry(ctx, id, alice); err != nil {
		t.Fatal(err)
	}
	bob := saga.Actor{Operator: "bob", Reason: "undone by hand"}
	if _, err := p.Request(ctx, id, saga.ActionMarkCompensated, bob); err != nil {
		t.Fatal(err)
	}
	if n, err := d.o.RunDue(ctx); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	got := auditOf(t, d.db, audit.Filter{Target: id})
	if len(got) != 3 {
		t.Fatalf("%d audit entries, want 3 (retry, the request filed, applied): %+v", len(got), got)
	}
	retry, filed, applied := got[0], got[1], got[2]
	if retry.Operator != "alice" || retry.Reason != "participant fixed" || retry.Source != "console 203.0.113.7" ||
		retry.Action != "saga.retry" || retry.Outcome != audit.Done || retry.Kind != audit.KindSaga || retry.Scope != "order" ||
		stateOf(t, retry.Before)["status"] != "stuck" || stateOf(t, retry.After)["status"] != "compensating" {
		t.Errorf("the retry's entry: %+v before %s after %s", retry, retry.Before, retry.After)
	}
	if filed.Operator != "bob" || filed.Action != "saga.mark-compensated" || filed.Outcome != audit.Requested || filed.Source != "go" ||
		stateOf(t, filed.After)["request"] != "mark-compensated" {
		t.Errorf("the request's entry: %+v after %s", filed, filed.After)
	}
	if applied.Operator != "bob" || applied.Reason != "undone by hand" || applied.Action != "saga.mark-compensated" ||
		applied.Outcome != audit.Applied || stateOf(t, applied.After)["status"] != "compensated" {
		t.Errorf("the applied request's entry: %+v after %s", applied, applied.After)
	}
}

// A request the orchestrator refuses when it comes to apply it is in the
// audit trail as refused, with why; a withdrawn one as withdrawn.
func TestRefusedAndWithdrawnRequestsAreAudited(t *testing.T) {
	t.Parallel()
	id := "o-audit-refused"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	if _, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "try again"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.o.Retry(ctx, id, operator); err != nil { // the saga moves: bob's request is stale
		t.Fatal(err)
	}
	if _, err := d.o.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Withdraw(ctx, id, saga.Actor{Operator: "carol", Reason: "not this one"}); err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, e := range auditOf(t, d.db, audit.Filter{Target: id}) {
		outcomes = append(outcomes, e.Operator+" "+e.Action+" "+e.Outcome)
		if e.Outcome == audit.Refused && !strings.Contains(string(e.Detail), "stale") {
			t.Errorf("refusal without its reason: %s", e.Detail)
		}
	}
	want := "bob saga.retry requested|alice saga.retry done|bob saga.retry refused|bob saga.retry requested|carol saga.withdraw done"
	if got := strings.Join(outcomes, "|"); got != want {
		t.Errorf("audit trail:\n%s\nwant\n%s", got, want)
	}
}

// A bulk operation planned by alice and confirmed by bob acts in bob's
// name, on alice's plan: each request is bob's with alice as OnBehalfOf,
// the sagas' history names both (actor bob, on_behalf_of alice), the
// operation says who confirmed it, and the audit trail has alice's plan
// and bob's requests on her behalf.
func TestBulkConfirmedByAnotherOperatorActsInTheirName(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ctx := context.Background()
	ids := s.StuckRefunds(t, db, "refund", 3)
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := p.Plan(ctx, saga.ActionRetry, saga.Query{Type: "refund"}, saga.Actor{Operator: "alice", Reason: "stock fixed"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(ctx, plan.ID, saga.Actor{Operator: "bob"}); !errors.Is(err, core.ErrNoActor) {
		t.Fatalf("Apply without a reason: %v, want core.ErrNoActor", err)
	}
	b, err := p.Apply(ctx, plan.ID, saga.Actor{Operator: "bob", Reason: "confirmed, stock fixed", From: "console 198.51.100.2"})
	if err != nil {
		t.Fatal(err)
	}
	if b.Operator != "alice" || b.ConfirmedBy != "bob" || b.Counts.Filed != 3 {
		t.Fatalf("operation %+v", b)
	}
	for _, id := range ids {
		r := s.Get(t, id).Request
		if r == nil || r.Operator != "bob" || r.OnBehalfOf != "alice" || r.Operation != plan.ID {
			t.Fatalf("saga %s: request %+v, want bob's on behalf of alice", id, r)
		}
	}
	s.Fix.Store(true)
	drain(t, s.O, p, plan.ID)
	for _, id := range ids {
		var filed, applied bool
		for _, h := range historyOf(t, s.O, id) {
			var d struct {
				OnBehalfOf string `json:"on_behalf_of"`
			}
			_ = json.Unmarshal(h.Detail, &d)
			mine := h.Actor == "bob" && d.OnBehalfOf == "alice"
			filed = filed || h.Event == "operator_request" && mine
			applied = applied || h.Event == "operator" && mine
			if (h.Event == "operator" || h.Event == "operator_request") && h.Actor == "alice" {
				t.Errorf("saga %s: the planner acts in the history: %+v", id, h)
			}
		}
		if !filed || !applied {
			t.Errorf("saga %s: history lacks bob's request (%v) or its application (%v) on behalf of alice", id, filed, applied)
		}
	}
	entries := auditOf(t, db, audit.Filter{Operation: plan.ID, Limit: 1000})
	if len(entries) != 7 || entries[0].Action != "saga.bulk.plan" || entries[0].Operator != "alice" {
		t.Fatalf("%d entries, want the plan and 3 filed, 3 applied: %+v", len(entries), entries)
	}
	for _, e := range entries[1:] {
		if e.Operator != "bob" || e.OnBehalfOf != "alice" || e.Action != "saga.retry" {
			t.Errorf("entry %+v: want bob's retry on behalf of alice", e)
		}
	}
	if e := entries[1]; e.Source != "console 198.51.100.2" || e.Reason != "confirmed, stock fixed" {
		t.Errorf("entry %+v: want the confirmer's source and reason", e)
	}
}
