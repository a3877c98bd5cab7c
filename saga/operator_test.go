package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

func newOperator(t *testing.T, d *driver) *saga.Orchestrator {
	t.Helper()
	p, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func historyEvents(t *testing.T, o *saga.Orchestrator, id, event string) []saga.HistoryEntry {
	t.Helper()
	var out []saga.HistoryEntry
	for _, h := range historyOf(t, o, id) {
		if h.Event == event {
			out = append(out, h)
		}
	}
	return out
}

// stuckSoon is stuckOnCompensation without its wait of 1000 hours, so
// the saga's deadline is still far.
func stuckSoon(t *testing.T, id string) *driver {
	t.Helper()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[0].CompensationRetry = saga.RetryPolicy{MaxAttempts: 2, MinBackoff: time.Second}
	})
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeFailure)
	d.reply(id, d.last(id), core.OutcomeFailure)
	d.tick(time.Second)
	d.reply(id, d.last(id), core.OutcomeFailure)
	if in := d.get(id); in.Status != saga.StatusStuck || in.Phase != saga.PhaseCompensating {
		t.Fatalf("saga %s phase %s", in.Status, in.Phase)
	}
	return d
}

func TestOperatorRequestAppliedByTheOrchestrator(t *testing.T) {
	t.Parallel()
	id := "o-req"
	d := stuckSoon(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	before := d.get(id)
	sent := len(d.commands(id))

	// Refused before anything is recorded: a forbidden action, an unknown
	// id, an unknown action, a missing reason.
	if _, err := p.Request(ctx, id, saga.ActionSkip, operator); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), "use MarkCompensated") {
		t.Fatalf("skip while compensating: %v", err)
	}
	if _, err := p.Request(ctx, "nope", saga.ActionRetry, operator); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := p.Request(ctx, id, "rewind", operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("unknown action: %v", err)
	}
	if _, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("no reason: %v", err)
	}
	if in := d.get(id); in.Request != nil || in.Revision != before.Revision || len(historyEvents(t, d.o, id, "operator_request")) != 0 {
		t.Fatalf("a refused request left something: %+v", in.Request)
	}

	in, err := p.Request(ctx, id, saga.ActionRetry, operator)
	if err != nil {
		t.Fatal(err)
	}
	if r := in.Request; r == nil || r.Action != saga.ActionRetry || r.Operator != "alice" || r.Reason != "ticket 42" || !r.RequestedAt.Equal(d.clock.Now()) {
		t.Fatalf("request %+v", in.Request)
	}
	if r := d.get(id).Request; r == nil || r.Action != saga.ActionRetry {
		t.Fatalf("stored request %+v", r)
	}
	if h := historyEvents(t, d.o, id, "operator_request"); len(h) != 1 || h[0].Actor != "alice" || h[0].Reason != "ticket 42" || !strings.Contains(string(h[0].Detail), `"retry"`) {
		t.Fatalf("request history %+v", h)
	}
	// Recording changed nothing else: no command, still stuck.
	if got := d.get(id); got.Status != saga.StatusStuck || len(d.commands(id)) != sent {
		t.Fatalf("the request acted by itself: %s", got.Status)
	}
	// One at a time.
	if _, err := p.Request(ctx, id, saga.ActionMarkCompensated, saga.Actor{Operator: "bob", Reason: "me too"}); !errors.Is(err, saga.ErrRequestPending) || !strings.Contains(err.Error(), "alice") {
		t.Fatalf("second request: %v", err)
	}

	// The orchestrator's timer pass applies it, as alice.
	n, err := d.o.RunDue(ctx)
	if err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	in = d.get(id)
	c := d.last(id)
	if in.Status != saga.StatusCompensating || in.Request != nil || c.Step != "credit" || c.Op != "compensation" || c.Attempt != 3 {
		t.Fatalf("after the request: %s request %+v command %+v", in.Status, in.Request, c)
	}
	if h := historyEvents(t, d.o, id, "operator"); len(h) != 1 || h[0].Actor != "alice" || h[0].Reason != "ticket 42" || !strings.Contains(string(h[0].Detail), "retry") {
		t.Fatalf("operator history %+v", h)
	}
	// Applied once: the next pass does nothing.
	if n, err := d.o.RunDue(ctx); err != nil || n != 0 || len(d.commands(id)) != sent+1 {
		t.Fatalf("second pass: %d, %v", n, err)
	}
	d.reply(id, c, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompensated {
		t.Fatalf("status %s", in.Status)
	}
	// A request for an ended saga is refused up front.
	if _, err := p.Request(ctx, id, saga.ActionRetry, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("retry after the end: %v", err)
	}
}

// A reply that saves the saga between the request and its application
// keeps the request: only applying it (or refusing it) clears it. Here
// the reply moved the saga to another step, so the request, decided on
// the step before, is refused as stale rather than applied to this one.
func TestOperatorRequestSurvivesAReply(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-req-reply"
	start(t, d.testBundle, def, id, 5)
	p := newOperator(t, d)
	ctx := context.Background()
	if _, err := p.Request(ctx, id, saga.ActionRetry, operator); err != nil {
		t.Fatal(err)
	}
	before := d.get(id)
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit done; approve (local) done; stock sent
	in := d.get(id)
	if in.Revision == before.Revision || in.Step != "stock" {
		t.Fatalf("the reply did not save the saga: step %s", in.Step)
	}
	if in.Request == nil || in.Request.Action != saga.ActionRetry || in.Request.Operator != "alice" {
		t.Fatalf("the reply's save erased the request: %+v", in.Request)
	}
	if n, err := d.o.RunDue(ctx); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	c := d.last(id)
	if in := d.get(id); in.Request != nil || c.Step != "stock" || c.Attempt != 1 {
		t.Fatalf("after the request: %+v, command %+v", in.Request, c)
	}
	h := historyEvents(t, d.o, id, "operator_refused")
	if len(h) != 1 || !strings.Contains(string(h[0].Detail), `stale: requested at step \"credit\"`) {
		t.Fatalf("refusal history %+v", h)
	}
}

// A request the saga's state no longer allows when the orchestrator comes
// to it is recorded as refused and dropped, not tried again and again.
func TestOperatorRequestRefusedWhenTheSagaMovedOn(t *testing.T) {
	t.Parallel()
	id := "o-req-moved"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	if _, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "try again"}); err != nil {
		t.Fatal(err)
	}
	// Meanwhile someone with the definitions finishes it by hand.
	if _, err := d.o.MarkCompensated(ctx, id, operator); err != nil {
		t.Fatal(err)
	}
	sent := len(d.commands(id))
	if n, err := d.o.RunDue(ctx); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	in := d.get(id)
	if in.Status != saga.StatusCompensated || in.Request != nil || len(d.commands(id)) != sent {
		t.Fatalf("after a refused request: %s %+v", in.Status, in.Request)
	}
	h := historyEvents(t, d.o, id, "operator_refused")
	if len(h) != 1 || h[0].Actor != "bob" || h[0].Reason != "try again" || !strings.Contains(string(h[0].Detail), "it has ended") {
		t.Fatalf("refusal history %+v", h)
	}
	if n, err := d.o.RunDue(ctx); err != nil || n != 0 {
		t.Fatalf("the refused request came back: %d, %v", n, err)
	}
}

// An orchestrator leaves alone the requests of the saga types and
// versions it does not run (another service's sagas in the same schema).
func TestOperatorRequestOfAnotherType(t *testing.T) {
	t.Parallel()
	id := "o-req-other"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	if _, err := p.Request(ctx, id, saga.ActionRetry, operator); err != nil {
		t.Fatal(err)
	}
	other, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := other.RunDue(ctx); err != nil || n != 0 {
		t.Fatalf("RunDue without the type: %d, %v", n, err)
	}
	// Nor does one with the type but not the saga's version (a rolling
	// deploy): it leaves the request to an orchestrator that has it.
	if err := other.Register(mustDefine(t, orderSpec(d.testBundle, 2))); err != nil {
		t.Fatal(err)
	}
	if n, err := other.RunDue(ctx); err != nil || n != 0 {
		t.Fatalf("RunDue without the version: %d, %v", n, err)
	}
	if in := d.get(id); in.Request == nil || in.Status != saga.StatusStuck {
		t.Fatalf("an orchestrator without the type touched the request: %s %+v", in.Status, in.Request)
	}
}
