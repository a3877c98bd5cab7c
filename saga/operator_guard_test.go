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

// pivotSpec: credit (remote, compensatable), pay (remote pivot: a timeout
// retries after a long backoff), ship (remote, retriable).
func pivotSpec(deadline time.Duration) saga.Spec[order] {
	return saga.Spec[order]{Type: "order", Version: 1, Deadline: deadline, Steps: []saga.Step[order]{
		{Name: "credit", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "credit"},
			Compensation: &saga.Command[order]{}, Timeout: time.Second},
		{Name: "pay", Kind: saga.Pivot, Action: &saga.Command[order]{Topic: "pay"}, Timeout: time.Second,
			Retry: saga.RetryPolicy{MaxAttempts: 3, MinBackoff: 10 * time.Hour, MaxBackoff: 10 * time.Hour}},
		{Name: "ship", Kind: saga.Retriable, Action: &saga.Command[order]{Topic: "ship"}, Timeout: time.Second,
			Retry: saga.RetryPolicy{MaxAttempts: 2, MinBackoff: time.Second}},
	}}
}

func specDriver(t *testing.T, spec saga.Spec[order]) (*driver, *saga.Definition[order]) {
	t.Helper()
	var def *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		def = mustDefine(t, spec)
		return []saga.Registrable{def}
	})
	return d, def
}

func noCompensation(t *testing.T, d *driver, id string) {
	t.Helper()
	for _, c := range d.commands(id) {
		if c.Op == core.OperationCompensation {
			t.Fatalf("saga %s compensated %s although its pivot may have taken effect", id, c.Step)
		}
	}
}

// The deadline of a saga whose pivot timed out and backs off, its reply
// still awaited, parks the saga: the pivot may have taken effect, so the
// steps before it are not compensated.
func TestDeadlineWhilePivotBacksOffAfterATimeoutParks(t *testing.T) {
	t.Parallel()
	d, def := specDriver(t, pivotSpec(time.Hour))
	id := "o-pivot-deadline"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit
	if c := d.last(id); c.Step != "pay" {
		t.Fatalf("command %+v", c)
	}
	d.tick(time.Second) // pay's attempt 1 times out: backoff of 10h, its reply still awaited
	if st := d.get(id).Steps["pay"]; st.Status != saga.StepBackoff || st.AwaitFrom != 1 {
		t.Fatalf("pay %+v", st)
	}
	d.tick(time.Hour) // the deadline
	in := d.get(id)
	if in.Status != saga.StatusStuck || in.Phase != saga.PhaseForward || in.Step != "pay" || in.LastError != "deadline exceeded" {
		t.Fatalf("after the deadline: %s %s at %s: %q", in.Status, in.Phase, in.Step, in.LastError)
	}
	noCompensation(t, d, id)
	// A late success of attempt 1 is not applied to a stuck saga, and an
	// operator's Retry resumes it forward.
	if _, err := d.o.Retry(context.Background(), id, operator); err != nil {
		t.Fatal(err)
	}
	d.reply(id, d.find(id, "pay", "action"), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeSuccess) // ship
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
	noCompensation(t, d, id)
}

// A pivot whose failure reply answered it took no effect: the deadline
// compensates the steps before it, as before.
func TestDeadlineWhilePivotBacksOffAfterAFailureCompensates(t *testing.T) {
	t.Parallel()
	spec := pivotSpec(time.Hour)
	spec.Steps[1].Retry.Retryable = func(error) bool { return true }
	d, def := specDriver(t, spec)
	id := "o-pivot-failed-deadline"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeFailure) // pay: backoff, answered
	d.tick(time.Hour)
	if c := d.last(id); c.Step != "credit" || c.Op != core.OperationCompensation {
		t.Fatalf("after the deadline: %+v", c)
	}
}

// A remote step an operator skipped after its action was sent (and never
// answered) may have taken effect: when the saga later fails, it is
// compensated with the others.
func TestSkippedSentStepIsCompensated(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) { s.Steps[0].OnTimeout = saga.TimeoutStuck })
	id := "o-skip-sent"
	ctx := context.Background()
	start(t, d.testBundle, def, id, 5)
	d.tick(time.Second) // credit's attempt 1 times out: stuck
	if in := d.get(id); in.Status != saga.StatusStuck || in.Step != "credit" {
		t.Fatalf("saga %s at %s", in.Status, in.Step)
	}
	if _, err := d.o.Skip(ctx, id, operator); err != nil {
		t.Fatal(err)
	}
	d.reply(id, d.last(id), core.OutcomeFailure) // stock fails: approve (local) is undone, then credit
	c := d.last(id)
	if c.Step != "credit" || c.Op != core.OperationCompensation {
		t.Fatalf("the skipped, sent credit step was not compensated: last command %+v", c)
	}
	d.reply(id, c, core.OutcomeSuccess)
	in := d.get(id)
	if in.Status != saga.StatusCompensated || in.Steps["credit"].Status != saga.StepCompensated {
		t.Fatalf("after compensation: %s, credit %+v", in.Status, in.Steps["credit"])
	}
}

// A Retry after a success reply that could not be applied sends the step's
// action again, in a parallel group as outside one: the reply's data is
// applied once the participant answers again, never lost.
func TestRetryAfterAnUnappliedReplyResendsInAGroupToo(t *testing.T) {
	t.Parallel()
	tx := func(o *order, r struct {
		Tx string `json:"tx"`
	}) error {
		if r.Tx == "" {
			return errors.New("no tx in the reply")
		}
		o.CreditTx = r.Tx
		return nil
	}
	for _, grouped := range []bool{false, true} {
		spec := groupSpec()
		spec.Steps[1].OnSuccess = saga.Reply(tx)
		if !grouped {
			spec.Steps[1].Group, spec.Steps[2].Group = "", ""
		}
		d, def := specDriver(t, spec)
		id := "o-unapplied"
		start(t, d.testBundle, def, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess) // reserve
		if grouped {
			d.reply(id, d.find(id, "stock", "action"), core.OutcomeSuccess)
		}
		d.reply(id, d.find(id, "credit", "action"), core.OutcomeSuccess) // "{}": no tx
		if in := d.get(id); in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "no tx") {
			t.Fatalf("grouped %v: %s %q", grouped, in.Status, in.LastError)
		}
		if _, err := d.o.Retry(context.Background(), id, operator); err != nil {
			t.Fatal(err)
		}
		c := d.find(id, "credit", "action")
		if c.Attempt != 2 {
			t.Fatalf("grouped %v: Retry did not send credit again: %v", grouped, steps(d.commands(id)))
		}
		d.deliver(replyMsg(id, c, core.OutcomeSuccess, "", `{"tx":"t-1"}`))
		if !grouped {
			d.reply(id, d.find(id, "stock", "action"), core.OutcomeSuccess)
		}
		d.reply(id, d.find(id, "ship", "action"), core.OutcomeSuccess)
		in := d.get(id)
		if in.Status != saga.StatusCompleted || dataOf(t, in).CreditTx != "t-1" || in.Steps["credit"].Unapplied {
			t.Fatalf("grouped %v: %s, data %s, credit %+v", grouped, in.Status, in.Data, in.Steps["credit"])
		}
	}
}

// An operator action on a saga whose deadline passed while it was stuck
// moves the deadline forward (by the definition's Deadline, from now),
// recorded with who and why: the next timer pass does not turn the action
// into the deadline's compensation. The same through an Operator request.
func TestOperatorActionPastTheDeadlineMovesIt(t *testing.T) {
	t.Parallel()
	for _, viaRequest := range []bool{false, true} {
		d, def := orderDriver(t, func(s *saga.Spec[order]) {
			s.Deadline = time.Hour
			s.Steps[0].OnTimeout = saga.TimeoutStuck
		})
		id := "o-late-retry"
		ctx := context.Background()
		start(t, d.testBundle, def, id, 5)
		d.tick(time.Second) // credit times out: stuck
		d.tick(2 * time.Hour)
		if in := d.get(id); in.Status != saga.StatusStuck || !in.DeadlineAt.Before(d.clock.Now()) {
			t.Fatalf("saga %s, deadline %v", in.Status, in.DeadlineAt)
		}
		if viaRequest {
			if _, err := newOperator(t, d).Request(ctx, id, saga.ActionRetry, operator); err != nil {
				t.Fatal(err)
			}
		} else if _, err := d.o.Retry(ctx, id, operator); err != nil {
			t.Fatal(err)
		}
		d.tick(0) // applies the request; a deadline left in the past would fire here
		in := d.get(id)
		if in.Status != saga.StatusRunning || in.Step != "credit" || in.DeadlineAt == nil || !in.DeadlineAt.Equal(d.clock.Now().Add(time.Hour)) {
			t.Fatalf("request %v: after the retry: %s at %s (%q), deadline %v", viaRequest, in.Status, in.Step, in.LastError, in.DeadlineAt)
		}
		h := historyEvents(t, d.o, id, "deadline_moved")
		if len(h) != 1 || h[0].Actor != "alice" || h[0].Reason != "ticket 42" || !strings.Contains(string(h[0].Detail), `"to"`) {
			t.Fatalf("request %v: deadline history %+v", viaRequest, h)
		}
		d.reply(id, d.find(id, "credit", "action"), core.OutcomeSuccess)
		d.reply(id, d.last(id), core.OutcomeSuccess) // stock
		if in := d.get(id); in.Status != saga.StatusCompleted {
			t.Fatalf("request %v: status %s (%q)", viaRequest, in.Status, in.LastError)
		}
	}
}

// A request records the saga's step and revision; one the saga moved on
// from before the orchestrator came to it (here another operator retried
// the same step meanwhile) is refused and recorded so, not applied.
func TestStaleOperatorRequestIsRefused(t *testing.T) {
	t.Parallel()
	id := "o-req-stale"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	before := d.get(id)
	in, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "try again"})
	if err != nil {
		t.Fatal(err)
	}
	if r := in.Request; r.Step != "credit" || r.Revision != before.Revision+1 || in.Revision != r.Revision {
		t.Fatalf("request %+v, saga revision %d (before %d)", r, in.Revision, before.Revision)
	}
	if _, err := d.o.Retry(ctx, id, operator); err != nil { // alice, at once: compensation attempt 3
		t.Fatal(err)
	}
	sent := len(d.commands(id))
	if n, err := d.o.RunDue(ctx); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	got := d.get(id)
	if got.Request != nil || len(d.commands(id)) != sent || d.last(id).Attempt != 3 {
		t.Fatalf("the stale request was applied: %+v, %d more commands", got.Request, len(d.commands(id))-sent)
	}
	h := historyEvents(t, d.o, id, "operator_refused")
	if len(h) != 1 || h[0].Actor != "bob" || !strings.Contains(string(h[0].Detail), "stale") {
		t.Fatalf("refusal history %+v", h)
	}
}

// A pending request can be withdrawn before the orchestrator applies it:
// nothing is applied, and the withdrawal is in the history.
func TestOperatorRequestWithdrawn(t *testing.T) {
	t.Parallel()
	id := "o-req-withdrawn"
	d, _ := stuckOnCompensation(t, id)
	p := newOperator(t, d)
	ctx := context.Background()
	if _, err := p.Withdraw(ctx, id, operator); !errors.Is(err, saga.ErrNoRequest) {
		t.Fatalf("withdraw with nothing pending: %v", err)
	}
	if _, err := p.Request(ctx, id, saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "try again"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Withdraw(ctx, "nope", operator); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := p.Withdraw(ctx, id, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("no reason: %v", err)
	}
	r, err := p.Withdraw(ctx, id, operator)
	if err != nil || r.Operator != "bob" || r.Action != saga.ActionRetry {
		t.Fatalf("withdraw: %+v, %v", r, err)
	}
	if got := d.get(id); got.Request != nil {
		t.Fatalf("stored request %+v", got.Request)
	}
	h := historyEvents(t, d.o, id, "operator_withdrawn")
	if len(h) != 1 || h[0].Actor != "alice" || h[0].Reason != "ticket 42" || !strings.Contains(string(h[0].Detail), `"bob"`) {
		t.Fatalf("withdrawal history %+v", h)
	}
	sent := len(d.commands(id))
	if n, err := d.o.RunDue(ctx); err != nil || n != 0 || len(d.commands(id)) != sent {
		t.Fatalf("a withdrawn request was applied: %d, %v", n, err)
	}
	// Another can be recorded now.
	if _, err := p.Request(ctx, id, saga.ActionMarkCompensated, operator); err != nil {
		t.Fatal(err)
	}
}
