package saga_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// The tests of this file drive orderSpec's stock step (timeout 1s, the
// default retry policy: 3 attempts, backoff from 1s) by hand.

// stockRunning starts a saga and answers its credit step: the saga then
// waits for stock's attempt 1, which it returns.
func stockRunning(t *testing.T, d *driver, def *saga.Definition[order], id string) cmd {
	t.Helper()
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit
	c := d.last(id)
	if c.Step != "stock" || c.Op != "action" || c.Attempt != 1 {
		t.Fatalf("waiting for %+v", c)
	}
	return c
}

// historyLines returns the saga's history as event:step:attempt lines.
func historyLines(t *testing.T, d *driver, id string) []string {
	t.Helper()
	var out []string
	for _, h := range historyOf(t, d.o, id) {
		out = append(out, h.Event+":"+h.Step+":"+h.Operation+":"+strings.Repeat("#", h.Attempt))
	}
	return out
}

// Replies queued longer than the timeout: attempt 1 times out, attempt 2
// goes out after the backoff, then attempt 1's reply arrives. The barrier
// answers every attempt alike, so it is the step's answer: the saga
// completes, and attempt 2's reply, once the step is done, is fenced.
func TestLateReplyOfEarlierAttemptCompletesStep(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "late-1"
	stock1 := stockRunning(t, d, def, id)
	d.tick(time.Second) // attempt 1 times out: backoff
	d.tick(time.Second) // attempt 2
	stock2 := d.last(id)
	if stock2.Step != "stock" || stock2.Attempt != 2 {
		t.Fatalf("after the timeout and the backoff: %+v", stock2)
	}
	d.deliver(replyMsg(id, stock1, core.OutcomeSuccess, "", `{}`))
	in := d.get(id)
	if in.Status != saga.StatusCompleted || in.Steps["stock"].Status != saga.StepDone {
		t.Fatalf("the late reply of attempt 1 was not applied: saga %s, stock %+v", in.Status, in.Steps["stock"])
	}
	if n := fencedCount(t, d.o, id); n != 0 {
		t.Fatalf("%d fenced replies", n)
	}
	d.reply(id, stock2, core.OutcomeSuccess)
	if n := fencedCount(t, d.o, id); n != 1 {
		t.Fatalf("attempt 2's reply after the step was done: %d fenced, want 1", n)
	}
	if got := d.get(id); got.Revision != in.Revision {
		t.Fatalf("attempt 2's reply changed the saga")
	}
	h := historyLines(t, d, id)
	if !slices.Contains(h, "reply:stock:action:#") || !slices.Contains(h, "fenced:stock:action:##") {
		t.Fatalf("history %v", h)
	}
}

// The late reply arrives while the step backs off after the timeout: the
// step is done and no attempt 2 is ever sent.
func TestLateReplyDuringBackoffSendsNoMoreAttempts(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "late-2"
	stock1 := stockRunning(t, d, def, id)
	d.tick(time.Second) // timeout
	if in := d.get(id); in.Steps["stock"].Status != saga.StepBackoff {
		t.Fatalf("after the timeout: stock %+v", in.Steps["stock"])
	}
	d.reply(id, stock1, core.OutcomeSuccess)
	d.tick(time.Minute)
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("saga %s", in.Status)
	}
	for _, c := range d.commands(id) {
		if c.Step == "stock" && c.Attempt > 1 {
			t.Fatalf("a new attempt went out after the late reply: %+v", c)
		}
	}
}

// A failure is not final at the barrier (a later attempt runs the action
// again), so the late failure of attempt 1 while attempt 2 is out is
// fenced: attempt 2 may still take effect, and the step must not fail (and
// leave that effect uncompensated) on attempt 1's word. Attempt 2's own
// failure is the step's answer.
func TestLateFailureOfEarlierAttemptIsFenced(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "late-failure-1"
	stock1 := stockRunning(t, d, def, id)
	d.tick(time.Second) // attempt 1 times out: backoff
	d.tick(time.Second) // attempt 2
	stock2 := d.last(id)
	if stock2.Step != "stock" || stock2.Attempt != 2 {
		t.Fatalf("after the timeout and the backoff: %+v", stock2)
	}
	d.deliver(replyMsg(id, stock1, core.OutcomeFailure, "out of stock", `{}`))
	if in := d.get(id); in.Status != saga.StatusRunning || in.Steps["stock"].Status != saga.StepRunning {
		t.Fatalf("attempt 1's late failure was applied: saga %s, stock %+v", in.Status, in.Steps["stock"])
	}
	if n := fencedCount(t, d.o, id); n != 1 {
		t.Fatalf("%d fenced replies, want 1", n)
	}
	d.deliver(replyMsg(id, stock2, core.OutcomeFailure, "out of stock", `{}`))
	if in := d.get(id); in.Status == saga.StatusRunning || in.Steps["stock"].Status == saga.StepRunning {
		t.Fatalf("attempt 2's failure was not applied: saga %s, stock %+v", in.Status, in.Steps["stock"])
	}
}

// What stays fenced: a reply for an older step that is done, for another
// operation, for an attempt never sent, a late reply after the step was
// answered, and an earlier attempt's reply once a later one was answered.
func TestRepliesTheSagaNoLongerAwaitsStayFenced(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		// stock's failures retry, so that the step backs off after an
		// answered attempt.
		s.Steps[2].Retry = saga.RetryPolicy{MaxAttempts: 4, Retryable: func(error) bool { return true }}
	})
	id := "fence-1"
	start(t, d.testBundle, def, id, 5)
	credit := d.last(id)
	d.reply(id, credit, core.OutcomeSuccess)
	stock1 := d.last(id)
	d.tick(time.Second) // stock attempt 1 times out
	d.tick(time.Second) // attempt 2
	stock2 := d.last(id)
	if stock2.Attempt != 2 {
		t.Fatalf("%+v", stock2)
	}
	before := d.get(id)
	d.reply(id, credit, core.OutcomeSuccess)                                             // the older, finished step
	d.reply(id, cmd{Step: "credit", Op: "action", Attempt: 2}, core.OutcomeSuccess)      // ... at an attempt never sent
	d.reply(id, cmd{Step: "stock", Op: "compensation", Attempt: 1}, core.OutcomeSuccess) // another operation
	d.reply(id, cmd{Step: "stock", Op: "action", Attempt: 3}, core.OutcomeSuccess)       // an attempt never sent
	d.reply(id, cmd{Step: "approve", Op: "action", Attempt: 1}, core.OutcomeSuccess)     // a local step
	if after := d.get(id); after.Revision != before.Revision || len(d.commands(id)) != 3 {
		t.Fatalf("a fenced reply changed the saga: revision %d -> %d", before.Revision, after.Revision)
	}
	if n := fencedCount(t, d.o, id); n != 5 {
		t.Fatalf("fenced %d, want 5", n)
	}

	// Attempt 2 answers (a retryable failure): the step backs off, and
	// attempt 1's reply, arriving now, is a second answer: fenced.
	d.reply(id, stock2, core.OutcomeFailure)
	if st := d.get(id).Steps["stock"]; st.Status != saga.StepBackoff {
		t.Fatalf("stock %+v", st)
	}
	d.reply(id, stock1, core.OutcomeSuccess)
	if st := d.get(id).Steps["stock"]; st.Status != saga.StepBackoff || fencedCount(t, d.o, id) != 6 {
		t.Fatalf("an answered attempt's late reply was applied: stock %+v", st)
	}
	// Attempt 3 goes out; attempts 1 and 2 were answered: still fenced.
	d.tick(2 * time.Second)
	stock3 := d.last(id)
	if stock3.Attempt != 3 {
		t.Fatalf("%+v", stock3)
	}
	d.reply(id, stock1, core.OutcomeSuccess)
	d.reply(id, stock2, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusRunning || fencedCount(t, d.o, id) != 8 {
		t.Fatalf("saga %s, fenced %d", in.Status, fencedCount(t, d.o, id))
	}
	d.reply(id, stock3, core.OutcomeSuccess)
	in := d.get(id)
	if in.Status != saga.StatusCompleted {
		t.Fatalf("saga %s", in.Status)
	}
	// After the end, every attempt is fenced.
	d.reply(id, stock1, core.OutcomeSuccess)
	if got := d.get(id); got.Revision != in.Revision || fencedCount(t, d.o, id) != 9 {
		t.Fatalf("a reply after the end changed the saga")
	}
}

// A timed-out attempt is retried after the step's RetryPolicy backoff
// (capped exponential), not at once.
func TestTimeoutsBackOff(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[2].Retry = saga.RetryPolicy{MaxAttempts: 4, MinBackoff: 2 * time.Second, MaxBackoff: 3 * time.Second}
	})
	id := "backoff-1"
	stockRunning(t, d, def, id)
	waits := []time.Duration{2 * time.Second, 3 * time.Second, 3 * time.Second} // before attempts 2, 3, 4
	for i, wait := range waits {
		attempt := i + 2
		d.tick(time.Second) // attempt-1 times out
		st := d.get(id).Steps["stock"]
		if st.Status != saga.StepBackoff || st.Attempt != attempt-1 {
			t.Fatalf("after attempt %d timed out: stock %+v", attempt-1, st)
		}
		d.tick(wait - time.Millisecond)
		if c := d.last(id); c.Attempt != attempt-1 {
			t.Fatalf("attempt %d sent %s before its backoff of %s ended", attempt, time.Millisecond, wait)
		}
		d.tick(time.Millisecond)
		if c := d.last(id); c.Step != "stock" || c.Op != "action" || c.Attempt != attempt {
			t.Fatalf("after the backoff of %s: %+v, want attempt %d", wait, c, attempt)
		}
	}
	// The last attempt times out: given up, compensated.
	d.tick(time.Second)
	in := d.get(id)
	if in.Status != saga.StatusCompensating || !strings.Contains(in.LastError, "4 attempts timed out") {
		t.Fatalf("saga %s %q", in.Status, in.LastError)
	}
	var backoffs int
	for _, h := range historyOf(t, d.o, id) {
		if h.Event == "backoff" && h.Step == "stock" {
			backoffs++
		}
	}
	if backoffs != 3 {
		t.Fatalf("%d backoff lines in the history, want 3", backoffs)
	}
}

// A compensation's attempts time out: an earlier attempt's late failure,
// while a later one is awaited, is not the answer (a failed compensation is
// retried and runs again: fenced); a timed-out attempt's late success,
// during the backoff, is (the barrier answers every later attempt with it).
func TestLateCompensationReplies(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "late-comp"
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit
	d.reply(id, d.last(id), core.OutcomeFailure) // stock refuses: compensate credit
	comp1 := d.last(id)
	if comp1.Step != "credit" || comp1.Op != "compensation" || comp1.Attempt != 1 {
		t.Fatalf("%+v", comp1)
	}
	d.tick(time.Second) // compensation attempt 1 times out: backoff
	if st := d.get(id).Steps["credit"]; st.Status != saga.StepCompBackoff {
		t.Fatalf("credit %+v", st)
	}
	d.tick(time.Second) // attempt 2
	comp2 := d.last(id)
	if comp2.Attempt != 2 {
		t.Fatalf("%+v", comp2)
	}
	d.reply(id, comp1, core.OutcomeFailure) // attempt 1's late failure: fenced
	if in := d.get(id); in.Status != saga.StatusCompensating || in.Steps["credit"].Status != saga.StepCompensating || fencedCount(t, d.o, id) != 1 {
		t.Fatalf("saga %s, credit %+v", in.Status, in.Steps["credit"])
	}
	d.tick(time.Second) // attempt 2 times out too: backoff
	if st := d.get(id).Steps["credit"]; st.Status != saga.StepCompBackoff || st.CompensationAttempt != 2 {
		t.Fatalf("credit %+v", st)
	}
	d.reply(id, comp2, core.OutcomeSuccess) // attempt 2's late success: the answer
	in := d.get(id)
	if in.Status != saga.StatusCompensated || in.Steps["credit"].Status != saga.StepCompensated {
		t.Fatalf("saga %s, credit %+v", in.Status, in.Steps["credit"])
	}
	for _, c := range d.commands(id) {
		if c.Op == "compensation" && c.Attempt > 2 {
			t.Fatalf("a compensation attempt after the late success: %+v", c)
		}
	}
}

// A group member backing off after a timeout when another member fails: it
// is retried no more and, as it may have taken effect, it is compensated
// with the steps before.
func TestGroupMemberBackingOffAfterTimeoutIsCompensated(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	id := "g-late"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess) // reserve
	d.tick(time.Second)                          // credit and stock time out: both back off
	in := d.get(id)
	if in.Steps["credit"].Status != saga.StepBackoff || in.Steps["stock"].Status != saga.StepBackoff {
		t.Fatalf("credit %+v, stock %+v", in.Steps["credit"], in.Steps["stock"])
	}
	d.reply(id, d.find(id, "credit", "action"), core.OutcomeFailure) // credit's late answer: refused
	in = d.get(id)
	if in.Status != saga.StatusCompensating || in.Steps["credit"].Status != saga.StepFailed {
		t.Fatalf("saga %s, credit %+v", in.Status, in.Steps["credit"])
	}
	if st := in.Steps["stock"]; st.Status != saga.StepCompensating || st.Attempt != 1 {
		t.Fatalf("stock %+v: want compensating, after its one attempt", st)
	}
	d.reply(id, d.last(id), core.OutcomeSuccess) // stock undone
	if c := d.last(id); c.Step != "reserve" || c.Op != "compensation" {
		t.Fatalf("then %+v", c)
	}
	d.reply(id, d.last(id), core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompensated {
		t.Fatalf("saga %s", in.Status)
	}
	if got := steps(d.commands(id)); !slices.Equal(got, []string{"reserve:action", "credit:action", "stock:action", "stock:compensation", "reserve:compensation"}) {
		t.Fatalf("commands %v", got)
	}
}
