package saga_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/saga"
)

// signalAudit returns the outcomes of the "saga.signal" audit entries,
// as "target:outcome", oldest first.
func signalAudit(t *testing.T, d *driver) []string {
	t.Helper()
	var out []string
	for _, r := range auditOf(t, d.db, audit.Filter{Action: "saga.signal"}) {
		if r.Operator != "alice" || r.Reason != "the PSP's webhook was lost" {
			t.Errorf("audit entry by %q for %q", r.Operator, r.Reason)
		}
		if strings.Contains(string(r.Detail), "phone") {
			t.Errorf("the audit entry holds the payload: %s", r.Detail)
		}
		out = append(out, r.Target+":"+r.Outcome)
	}
	return out
}

// An operator's event, by id or by key, applies as a signal does, with an
// "operator" line in the saga's history and an audit entry; it is refused
// with Signal's typed errors (the refusal recorded and audited), for an
// incomplete Actor, and as stale when the saga changed since the operator
// looked.
func TestOperatorSignalAppliesRefusesAndAudits(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	by := saga.Actor{Operator: "alice", Reason: "the PSP's webhook was lost"}
	for _, id := range []string{"op-1", "op-2"} {
		startCheckout(t, d, def, checkout{ID: id, PaymentID: "pi-" + id})
	}
	looked := d.get("op-1")
	d.reply("op-1", d.last("op-1"), core.OutcomeSuccess) // waiting now
	stale := by
	stale.Revision = looked.Revision
	ev := saga.EventTarget{SagaID: "op-1", Event: "payment.confirmed", EventID: "op-ev-1"}
	if err := d.o.Signal(ctx, ev, confirmation{Ref: "phone"}, stale); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), "stale") {
		t.Fatalf("stale signal: %v", err)
	}
	if err := d.o.Signal(ctx, ev, confirmation{Ref: "phone"}, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("signal without a reason: %v", err)
	}
	if err := d.o.Signal(ctx, ev, confirmation{Ref: "phone"}, by); err != nil {
		t.Fatal(err)
	}
	if in := d.get("op-1"); in.Status != saga.StatusCompleted {
		t.Fatalf("op-1 is %s at %s", in.Status, in.Step)
	}
	var operator []string
	for _, h := range historyOf(t, d.o, "op-1") {
		if h.Event == "operator" {
			operator = append(operator, h.Actor+": "+h.Reason)
		}
	}
	if !slices.Equal(operator, []string{"alice: the PSP's webhook was lost"}) {
		t.Fatalf("operator lines %q", operator)
	}

	ev.EventID = "op-ev-2"
	if err := d.o.Signal(ctx, ev, nil, by); !errors.Is(err, saga.ErrSagaEnded) {
		t.Fatalf("signal to an ended saga: %v", err)
	}
	byKey := saga.EventTarget{Type: "order", Key: "payment_id", Value: "pi-op-2", Event: "payment.confirmed", EventID: "op-ev-3"}
	if err := d.o.Signal(ctx, byKey, confirmation{Ref: "phone"}, by); err != nil {
		t.Fatal(err)
	}
	if got := d.eventStates("op-2"); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
		t.Fatalf("op-2's events %v (stored before its wait)", got)
	}
	byKey.Value = "pi-nobody"
	if err := d.o.Signal(ctx, byKey, nil, by); !errors.Is(err, saga.ErrKeyNotHeld) {
		t.Fatalf("signal by a key nobody holds: %v", err)
	}
	if err := d.o.Signal(ctx, saga.EventTarget{SagaID: "nobody", Event: "payment.confirmed"}, nil, by); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("signal to an unknown saga: %v", err)
	}
	want := []string{"op-1:done", "op-1:refused", "op-2:done", ":refused"}
	if got := signalAudit(t, d); !slices.Equal(got, want) {
		t.Fatalf("audit %q, want %q", got, want)
	}
}

// An Orchestrator without the saga's definition (the millrace command)
// stores the operator's event for the service's orchestrator, whose next
// pass applies it.
func TestOperatorSignalWithoutTheDefinitionIsAppliedByTheService(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	startCheckout(t, d, def, checkout{ID: "op-3", PaymentID: "pi-3"})
	d.reply("op-3", d.last("op-3"), core.OutcomeSuccess)
	tool, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	by := saga.Actor{Operator: "alice", Reason: "the PSP's webhook was lost"}
	if err := tool.Signal(ctx, saga.EventTarget{SagaID: "op-3", Event: "payment.confirmed", EventID: "op-ev-4"}, confirmation{Ref: "cli"}, by); err != nil {
		t.Fatal(err)
	}
	if got := d.eventStates("op-3"); !slices.Equal(got, []string{"payment.confirmed/new"}) {
		t.Fatalf("events %v, want it stored new", got)
	}
	if _, err := d.o.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	if in := d.get("op-3"); in.Status != saga.StatusCompleted {
		t.Fatalf("op-3 is %s at %s", in.Status, in.Step)
	}
	if got := signalAudit(t, d); !slices.Equal(got, []string{"op-3:done"}) {
		t.Fatalf("audit %q", got)
	}
}

// An operator's event by a shared key that one saga takes and another
// refuses (its version waits for no such event) is audited per saga: done
// for the one, refused with its own reason for the other. (Both were
// audited as done.)
func TestOperatorSignalByKeyAuditsEachSagaByItsOwnOutcome(t *testing.T) {
	t.Parallel()
	def := mustDefine(t, checkoutSpec())
	spec2 := checkoutSpec()
	spec2.Version, spec2.Steps = 2, []saga.Step[checkout]{spec2.Steps[0], spec2.Steps[2]} // no wait for the payment
	def2 := mustDefine(t, spec2)
	d := setupDriver(t, func(*testBundle) []saga.Registrable { return []saga.Registrable{def, def2} })
	ctx := context.Background()
	by := saga.Actor{Operator: "alice", Reason: "the PSP's webhook was lost"}
	startCheckout(t, d, def, checkout{ID: "v1-1", PaymentID: "pi-v1-1", Batch: "b-9"})
	d.reply("v1-1", d.last("v1-1"), core.OutcomeSuccess) // waiting for the payment
	startCheckout(t, d, def2, checkout{ID: "v2-1", PaymentID: "pi-v2-1", Batch: "b-9"})
	byKey := saga.EventTarget{Type: "order", Key: "batch", Value: "b-9", Event: "payment.confirmed", EventID: "batch-9-paid"}
	if err := d.o.Signal(ctx, byKey, confirmation{Ref: "phone"}, by); err != nil {
		t.Fatalf("signal by the shared key: %v (one saga took it)", err)
	}
	if in := d.get("v1-1"); in.Status != saga.StatusCompleted {
		t.Fatalf("v1-1 is %s at %s", in.Status, in.Step)
	}
	got := map[string]string{}
	for _, r := range auditOf(t, d.db, audit.Filter{Action: "saga.signal"}) {
		got[r.Target] = r.Outcome
		if r.Target == "v2-1" && !strings.Contains(string(r.Detail), "no step of order v2 waits for it") {
			t.Errorf("v2-1's refusal does not say why: %s", r.Detail)
		}
	}
	if want := map[string]string{"v1-1": "done", "v2-1": "refused"}; !maps.Equal(got, want) {
		t.Fatalf("audit outcomes %v, want %v", got, want)
	}
}
