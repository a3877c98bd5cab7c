package compensation_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// Duplicate action: a second attempt (a new message) does not run the
// function and gets the same reply.
func TestDuplicateActionRepliesTheSame(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	saga := uuid.NewString()
	must(t, b.handle(action(saga, 1)))
	must(t, b.handle(action(saga, 2)))
	must(t, b.handle(action(saga, 3)))
	if n := b.actionCalls.Load(); n != 1 {
		t.Fatalf("action ran %d times, want 1", n)
	}
	if n := b.effects(t, saga, "reserve"); n != 1 {
		t.Fatalf("reserve effects = %d, want 1", n)
	}
	rs := b.replies(t, saga)
	if len(rs) != 3 {
		t.Fatalf("replies = %d, want 3: %+v", len(rs), rs)
	}
	for i, r := range rs {
		if r.Outcome != core.OutcomeSuccess || r.Payload != rs[0].Payload || r.Operation != core.OperationAction ||
			r.Step != "credit" || r.SagaID != saga || r.Key != saga {
			t.Fatalf("reply %d = %+v, want the first reply's outcome and payload %+v", i, r, rs[0])
		}
		if want := []string{"1", "2", "3"}[i]; r.Attempt != want {
			t.Fatalf("reply %d attempt = %s, want %s (the command's attempt)", i, r.Attempt, want)
		}
	}
	if !strings.Contains(rs[0].Payload, compensation.IdempotencyKey(saga, "credit", core.OperationAction)) {
		t.Fatalf("reply payload %s lacks the idempotency key", rs[0].Payload)
	}
	if got := b.metric(t, "duplicates_total"); got != 2 {
		t.Fatalf("duplicates_total = %v, want 2", got)
	}
}

// Empty compensation: a compensation with no action runs no function,
// replies success, and is recorded; the late action that follows is
// cancelled and does not run.
func TestEmptyCompensationThenLateAction(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	saga := uuid.NewString()
	must(t, b.handle(compensationOf(saga, 1)))
	if b.compensateCalls.Load() != 0 {
		t.Fatal("the compensation function ran with no action")
	}
	if outcome, empty, ok := b.barrier(t, saga, core.OperationCompensation); !ok || outcome != core.OutcomeSuccess || !empty {
		t.Fatalf("compensation row: %q empty=%v found=%v, want success, empty", outcome, empty, ok)
	}
	rs := b.replies(t, saga)
	if len(rs) != 1 || rs[0].Outcome != core.OutcomeSuccess || rs[0].Operation != core.OperationCompensation {
		t.Fatalf("replies = %+v, want one compensation success", rs)
	}

	// The late action, twice (a retry of the timed-out attempt).
	must(t, b.handle(action(saga, 1)))
	must(t, b.handle(action(saga, 2)))
	if n := b.actionCalls.Load(); n != 0 {
		t.Fatalf("the late action ran %d times", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE saga_id = $1`, saga); n != 0 {
		t.Fatalf("effects = %d, want none", n)
	}
	rs = b.replies(t, saga)[1:]
	if len(rs) != 2 {
		t.Fatalf("late action replies = %+v, want 2", rs)
	}
	for _, r := range rs {
		if r.Outcome != core.OutcomeCancelled || r.Operation != core.OperationAction || r.Reason == "" {
			t.Fatalf("late action reply = %+v, want cancelled with a reason", r)
		}
	}
	if got := b.metric(t, "late_actions_total"); got != 2 {
		t.Fatalf("late_actions_total = %v, want 2", got)
	}
	if got := b.metric(t, "empty_compensations_total"); got != 1 {
		t.Fatalf("empty_compensations_total = %v, want 1", got)
	}
}

// A compensation delivered twice (two attempts) undoes the action once and
// replies success twice.
func TestCompensationDeliveredTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	saga := uuid.NewString()
	must(t, b.handle(action(saga, 1)))
	must(t, b.handle(compensationOf(saga, 1)))
	must(t, b.handle(compensationOf(saga, 2)))
	if n := b.compensateCalls.Load(); n != 1 {
		t.Fatalf("compensation ran %d times, want 1", n)
	}
	if r, u := b.effects(t, saga, "reserve"), b.effects(t, saga, "release"); r != 1 || u != 1 {
		t.Fatalf("effects reserve=%d release=%d, want 1 and 1", r, u)
	}
	if a, c, d := b.metric(t, "actions_total"), b.metric(t, "compensations_total"), b.metric(t, "duplicates_total"); a != 1 || c != 1 || d != 1 {
		t.Fatalf("metrics: actions %v, compensations %v, duplicates %v; want 1, 1, 1", a, c, d)
	}
	if outcome, empty, _ := b.barrier(t, saga, core.OperationCompensation); outcome != core.OutcomeSuccess || empty {
		t.Fatalf("compensation row %q empty=%v, want success, not empty", outcome, empty)
	}
	rs := b.replies(t, saga)
	if len(rs) != 3 || rs[1].Outcome != core.OutcomeSuccess || rs[2].Outcome != core.OutcomeSuccess || rs[1].Payload != rs[2].Payload {
		t.Fatalf("replies = %+v", rs)
	}
	// An action after its compensation (a duplicate of attempt 1) still
	// answers with its first reply: it ran, and was compensated.
	must(t, b.handle(action(saga, 3)))
	if rs := b.replies(t, saga); rs[3].Outcome != core.OutcomeSuccess || rs[3].Payload != rs[0].Payload || b.actionCalls.Load() != 1 {
		t.Fatalf("action after compensation: %+v, calls %d", rs[3], b.actionCalls.Load())
	}
}

// The compensation gets the action's reply.
func TestCompensationSeesActionReply(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	var got []byte
	must(t, compensation.Register(b.p, "ship",
		func(ctx context.Context, _ pgx.Tx, call compensation.Call, cmd struct{}) (map[string]string, error) {
			return map[string]string{"booking": "b-" + call.SagaID}, nil
		},
		func(ctx context.Context, _ pgx.Tx, call compensation.Call, cmd struct{}) error {
			got = call.ActionReply
			return nil
		}))
	saga := uuid.NewString()
	a := action(saga, 1)
	a.Metadata.Set(core.MetadataSagaCommand, "ship")
	c := compensationOf(saga, 1)
	c.Metadata.Set(core.MetadataSagaCommand, "ship")
	must(t, b.handle(a))
	must(t, b.handle(c))
	if string(got) != `{"booking":"b-`+saga+`"}` {
		t.Fatalf("ActionReply = %s", got)
	}
}

// A business failure of the action: one failure reply with the reason, no
// effect, recorded, and the same failure for the same attempt sent again
// (a later attempt runs the action again: TestFailedActionRunsAgain); its
// compensation is empty.
func TestActionBusinessFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	b.setFailAction(func(compensation.Call) error { return compensation.Fail("insufficient credit\x00\xff") })
	saga := uuid.NewString()
	must(t, b.handle(action(saga, 1)))
	must(t, b.handle(action(saga, 1)))
	if n := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE saga_id = $1`, saga); n != 0 {
		t.Fatalf("a failed action left %d effects", n)
	}
	if n := b.actionCalls.Load(); n != 1 {
		t.Fatalf("action ran %d times, want 1", n)
	}
	rs := b.replies(t, saga)
	if len(rs) != 2 {
		t.Fatalf("replies %+v", rs)
	}
	for _, r := range rs {
		if r.Outcome != core.OutcomeFailure || !strings.HasPrefix(r.Reason, "insufficient credit") || r.Payload != "{}" {
			t.Fatalf("reply %+v, want failure: insufficient credit", r)
		}
	}
	must(t, b.handle(compensationOf(saga, 1)))
	if _, empty, _ := b.barrier(t, saga, core.OperationCompensation); !empty || b.compensateCalls.Load() != 0 {
		t.Fatalf("compensation of a failed action: empty=%v calls=%d; want empty, no call", empty, b.compensateCalls.Load())
	}
	if got := b.metric(t, "business_failures_total"); got != 1 {
		t.Fatalf("business_failures_total = %v, want 1", got)
	}
}

// A technical error rolls everything back and replies nothing; the retry
// that succeeds replies once.
func TestTechnicalErrorIsRetriedWithoutReply(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	boom := errors.New("database went away")
	var fails sync.Map
	b.setFailAction(func(call compensation.Call) error {
		if _, done := fails.LoadOrStore(call.SagaID, true); !done {
			return boom
		}
		return nil
	})
	saga := uuid.NewString()
	msg := action(saga, 1)
	if err := b.handle(msg); !errors.Is(err, boom) {
		t.Fatalf("first try: %v, want the technical error", err)
	}
	if rs := b.replies(t, saga); len(rs) != 0 {
		t.Fatalf("a technical error replied: %+v", rs)
	}
	if _, _, ok := b.barrier(t, saga, core.OperationAction); ok {
		t.Fatal("a technical error left a barrier row")
	}
	must(t, b.handle(msg.Copy())) // the redelivery
	must(t, b.handle(msg.Copy())) // and a duplicate of it: the inbox drops it
	if rs := b.replies(t, saga); len(rs) != 1 || rs[0].Outcome != core.OutcomeSuccess {
		t.Fatalf("replies = %+v, want one success", rs)
	}
	if n := b.effects(t, saga, "reserve"); n != 1 {
		t.Fatalf("effects = %d, want 1", n)
	}
}

// A compensation's business failure is replied, has no effect, and is not
// final: the next attempt runs it again.
func TestCompensationBusinessFailureIsRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	saga := uuid.NewString()
	must(t, b.handle(action(saga, 1)))
	b.setFailCompensation(func(call compensation.Call) error {
		if call.Attempt <= 2 {
			return compensation.Fail("ledger closed")
		}
		return nil
	})
	for attempt := 1; attempt <= 4; attempt++ {
		must(t, b.handle(compensationOf(saga, attempt)))
	}
	rs := b.replies(t, saga)[1:]
	want := []string{core.OutcomeFailure, core.OutcomeFailure, core.OutcomeSuccess, core.OutcomeSuccess}
	for i, r := range rs {
		if r.Outcome != want[i] {
			t.Fatalf("compensation replies %+v, want outcomes %v", rs, want)
		}
	}
	if r := rs[0].Reason; r != "ledger closed" {
		t.Fatalf("reason %q", r)
	}
	if n := b.compensateCalls.Load(); n != 3 {
		t.Fatalf("compensation ran %d times, want 3 (two failures, one success)", n)
	}
	if u := b.effects(t, saga, "release"); u != 1 {
		t.Fatalf("release effects = %d, want 1", u)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.reservation+` WHERE saga_id = $1`, saga); n != 0 {
		t.Fatal("the reservation is still there")
	}
}

// An action and its compensation arriving at the same moment on two
// consumers: the barrier decides one order, atomically.
func TestActionAndCompensationRace(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	const sagas = 200
	ids := make([]string, sagas)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4*sagas)
	for w := range 4 {
		wg.Go(func() {
			for i := range ids {
				var msg = action(ids[i], 1+w)
				if (i+w)%2 == 0 {
					msg = compensationOf(ids[i], 1+w)
				}
				if err := b.handle(msg); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, id := range ids {
		r, u := b.effects(t, id, "reserve"), b.effects(t, id, "release")
		if r > 1 || u != r {
			t.Fatalf("saga %s: reserve %d release %d; want both 0 or both 1", id, r, u)
		}
		if n := b.count(t, `SELECT count(*) FROM `+b.reservation+` WHERE saga_id = $1`, id); n != 0 {
			t.Fatalf("saga %s: a reservation outlived its compensation", id)
		}
		if n := len(b.replies(t, id)); n != 4 {
			t.Fatalf("saga %s: %d replies, want 4", id, n)
		}
	}
}

// The metrics carry the participant and command labels.
func TestMetricsLabels(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	must(t, b.handle(action(uuid.NewString(), 1)))
	n, err := testutil.GatherAndCount(b.metrics, "millrace_compensation_actions_total")
	if err != nil || n != 1 {
		t.Fatalf("actions_total series = %d, %v", n, err)
	}
	want := `# HELP millrace_compensation_actions_total Saga action functions run.
# TYPE millrace_compensation_actions_total counter
millrace_compensation_actions_total{command="reserve_credit",participant="payments"} 1
`
	if err := testutil.GatherAndCompare(b.metrics, strings.NewReader(want), "millrace_compensation_actions_total"); err != nil {
		t.Fatal(err)
	}
}
