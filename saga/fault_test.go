package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

func orderDriver(t *testing.T, tweak func(*saga.Spec[order])) (*driver, *saga.Definition[order]) {
	t.Helper()
	var def *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		spec := orderSpec(b, 1)
		if tweak != nil {
			tweak(&spec)
		}
		def = mustDefine(t, spec)
		return []saga.Registrable{def}
	})
	return d, def
}

// fencedCount is the number of fenced replies in a saga's history: a
// collapsed run of identical ones counts as its count.
func fencedCount(t *testing.T, o *saga.Orchestrator, id string) int {
	n := 0
	for _, h := range historyOf(t, o, id) {
		if h.Event == "fenced" {
			n += fencedRepeats(t, h)
		}
	}
	return n
}

// fencedRepeats is how many identical fenced replies h stands for.
func fencedRepeats(t testing.TB, h saga.HistoryEntry) int {
	t.Helper()
	if len(h.Detail) == 0 {
		return 1
	}
	var d struct {
		Count int `json:"count"`
	}
	if err := json.Unmarshal(h.Detail, &d); err != nil {
		t.Fatalf("fenced entry's detail %s: %v", h.Detail, err)
	}
	return max(d.Count, 1)
}

func TestDuplicateStaleAndReorderedRepliesChangeNothing(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-dup"
	start(t, d.testBundle, def, id, 5)
	credit := d.last(id)
	// The outbox keeps the payload byte for byte, as the definition encoded it.
	if credit != (cmd{Topic: "credit", Step: "credit", Op: "action", Command: "credit", Attempt: 1, Payload: `{"amount":5,"order":"o-dup"}`}) {
		t.Fatalf("first command %+v", credit)
	}
	first := replyMsg(id, credit, core.OutcomeSuccess, "", `{"tx":"t1"}`)
	d.deliver(first)
	stock := d.last(id)
	if stock.Step != "stock" || stock.Attempt != 1 {
		t.Fatalf("second command %+v", stock)
	}
	before := d.get(id)

	// The same message again: the inbox drops it, not even history.
	d.deliver(first)
	// The same reply as a new message (the participant's barrier answering
	// a repeated attempt): fenced.
	d.reply(id, credit, core.OutcomeSuccess)
	// Replies the saga never asked for: a future attempt, a compensation,
	// an unknown step, a failure of the finished step.
	d.reply(id, cmd{Step: "stock", Op: "action", Attempt: 2}, core.OutcomeSuccess)
	d.reply(id, cmd{Step: "credit", Op: "compensation", Attempt: 1}, core.OutcomeSuccess)
	d.reply(id, cmd{Step: "nope", Op: "action", Attempt: 1}, core.OutcomeSuccess)
	d.reply(id, credit, core.OutcomeFailure)
	after := d.get(id)
	if after.Revision != before.Revision || string(after.Data) != string(before.Data) || len(d.commands(id)) != 2 {
		t.Fatalf("a fenced reply changed the saga: revision %d -> %d, data %s -> %s", before.Revision, after.Revision, before.Data, after.Data)
	}
	if n := fencedCount(t, d.o, id); n != 5 {
		t.Fatalf("fenced replies in history: %d, want 5", n)
	}

	// Reordered: attempt 1 times out, attempt 2 goes out after the
	// backoff, then attempt 1's reply arrives late: the barrier answers
	// every attempt alike, so it is the step's answer; attempt 2's reply,
	// once the step is done, is fenced.
	d.tick(time.Second) // the timeout
	d.tick(time.Second) // the backoff
	stock2 := d.last(id)
	if stock2.Step != "stock" || stock2.Attempt != 2 {
		t.Fatalf("after the timeout: %+v", stock2)
	}
	d.reply(id, stock, core.OutcomeSuccess)
	in := d.get(id)
	if in.Status != saga.StatusCompleted || dataOf(t, in).CreditTx != "t1" {
		t.Fatalf("saga %s data %s", in.Status, in.Data)
	}
	d.reply(id, stock2, core.OutcomeSuccess)
	if got := d.get(id); got.Revision != in.Revision {
		t.Fatalf("attempt 2's reply after the step was done changed the saga")
	}
	// After the end, everything is fenced.
	d.reply(id, stock2, core.OutcomeFailure)
	if got := d.get(id); got.Revision != in.Revision || got.Status != saga.StatusCompleted {
		t.Fatalf("a reply after the end changed the saga")
	}
	if n := fencedCount(t, d.o, id); n != 7 {
		t.Fatalf("fenced replies in history: %d, want 7", n)
	}
}

func TestTimeoutRetriesWithNewAttemptThenCompensates(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-timeout"
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	for attempt := 1; attempt <= 3; attempt++ {
		c := d.last(id)
		if c.Step != "stock" || c.Op != "action" || c.Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, c)
		}
		d.tick(999 * time.Millisecond)
		if got := d.last(id); got != c {
			t.Fatalf("retried before the timeout: %+v", got)
		}
		d.tick(time.Millisecond)
		if attempt < 3 {
			if got := d.last(id); got != c {
				t.Fatalf("retried at the timeout, with no backoff: %+v", got)
			}
			d.tick(time.Second << (attempt - 1)) // the default policy's backoff: 1s, 2s
		}
	}
	// Three attempts timed out (the default policy): the stock step may
	// have taken effect, so it is compensated first, then approve (local),
	// then credit.
	c := d.last(id)
	if c.Step != "stock" || c.Op != "compensation" || c.Command != "return-stock" || c.Attempt != 1 {
		t.Fatalf("after the last timeout: %+v", c)
	}
	in := d.get(id)
	if in.Status != saga.StatusCompensating || in.Steps["stock"].Status != saga.StepCompensating {
		t.Fatalf("saga %s, stock %+v", in.Status, in.Steps["stock"])
	}
	d.reply(id, c, core.OutcomeSuccess)
	c = d.last(id)
	if c.Step != "credit" || c.Op != "compensation" || c.Command != "release-credit" {
		t.Fatalf("then: %+v", c)
	}
	if got := d.effects(id); !slices.Equal(got, []string{"approve:do", "approve:undo"}) {
		t.Fatalf("local effects %v", got)
	}
	d.reply(id, c, core.OutcomeSuccess)
	in = d.get(id)
	if in.Status != saga.StatusCompensated || !strings.Contains(in.LastError, "3 attempts timed out") || in.NextWakeupAt != nil {
		t.Fatalf("saga %s %q wakeup %v", in.Status, in.LastError, in.NextWakeupAt)
	}
}

func TestCompensationFailsTwiceThenSucceeds(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-comp"
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeFailure) // stock refuses
	for attempt := 1; attempt <= 2; attempt++ {
		c := d.last(id)
		if c.Step != "credit" || c.Op != "compensation" || c.Attempt != attempt {
			t.Fatalf("compensation attempt %d: %+v", attempt, c)
		}
		d.reply(id, c, core.OutcomeFailure)
		in := d.get(id)
		if in.Status != saga.StatusCompensating || in.Steps["credit"].Status != saga.StepCompBackoff {
			t.Fatalf("after failure %d: %s %+v", attempt, in.Status, in.Steps["credit"])
		}
		// Backoff: 1s, then 2s. Nothing is sent before it ends.
		wait := time.Duration(attempt) * time.Second
		d.tick(wait - time.Millisecond)
		if got := d.last(id); got != c {
			t.Fatalf("retried in a tight loop: %+v", got)
		}
		d.tick(time.Millisecond)
	}
	c := d.last(id)
	if c.Attempt != 3 {
		t.Fatalf("third try %+v", c)
	}
	d.reply(id, c, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompensated {
		t.Fatalf("status %s", in.Status)
	}
}

var operator = saga.Actor{Operator: "alice", Reason: "ticket 42"}

func stuckOnCompensation(t *testing.T, id string) (*driver, *saga.Definition[order]) {
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
	in := d.get(id)
	if in.Status != saga.StatusStuck || in.Phase != saga.PhaseCompensating || in.NextWakeupAt != nil ||
		in.LastError != "compensation of step credit failed 2 times: failure: because" {
		t.Fatalf("saga %s phase %s wakeup %v: %q", in.Status, in.Phase, in.NextWakeupAt, in.LastError)
	}
	// Stuck means nothing fires any more, however long we wait.
	n := len(d.commands(id))
	d.tick(1000 * time.Hour)
	if len(d.commands(id)) != n || d.get(id).Status != saga.StatusStuck {
		t.Fatal("a stuck saga moved on its own")
	}
	return d, def
}

func TestStuckCompensationThenOperatorRetry(t *testing.T) {
	t.Parallel()
	id := "o-stuck"
	d, _ := stuckOnCompensation(t, id)
	ctx := context.Background()
	if _, err := d.o.Skip(ctx, id, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("skip while compensating: %v", err)
	}
	in, err := d.o.Retry(ctx, id, operator)
	if err != nil {
		t.Fatal(err)
	}
	c := d.last(id)
	if in.Status != saga.StatusCompensating || c.Step != "credit" || c.Op != "compensation" || c.Attempt != 3 {
		t.Fatalf("after retry: %s %+v", in.Status, c)
	}
	d.reply(id, c, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompensated {
		t.Fatalf("status %s", in.Status)
	}
	var op *saga.HistoryEntry
	for _, h := range historyOf(t, d.o, id) {
		if h.Event == "operator" {
			op = &h
		}
	}
	if op == nil || op.Actor != "alice" || op.Reason != "ticket 42" || !strings.Contains(string(op.Detail), "retry") {
		t.Fatalf("operator action not in the history: %+v", op)
	}
	if _, err := d.o.Retry(ctx, id, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("retry after the end: %v", err)
	}
}

func TestStuckCompensationThenMarkCompensated(t *testing.T) {
	t.Parallel()
	id := "o-mark"
	d, _ := stuckOnCompensation(t, id)
	n := len(d.commands(id))
	in, err := d.o.MarkCompensated(context.Background(), id, operator)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompensated || len(d.commands(id)) != n {
		t.Fatalf("status %s, %d commands", in.Status, len(d.commands(id))-n)
	}
}

func TestStuckStepThenSkip(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) { s.Steps[2].OnTimeout = saga.TimeoutStuck })
	id := "o-skip"
	ctx := context.Background()
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.tick(time.Second)
	in := d.get(id)
	if in.Status != saga.StatusStuck || in.Step != "stock" || !strings.Contains(in.LastError, "timed out") {
		t.Fatalf("saga %s at %s: %q", in.Status, in.Step, in.LastError)
	}
	if _, err := d.o.MarkCompensated(ctx, id, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("mark-compensated going forward: %v", err)
	}
	if _, err := d.o.Skip(ctx, id, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("skip without a reason: %v", err)
	}
	if _, err := d.o.Skip(ctx, "nobody", operator); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("skip of an unknown saga: %v", err)
	}
	in, err := d.o.Skip(ctx, id, operator)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompleted || in.Steps["stock"].Status != saga.StepSkipped {
		t.Fatalf("after skip: %s %+v", in.Status, in.Steps["stock"])
	}
}

func TestAbortCompensates(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-abort"
	start(t, d.testBundle, def, id, 5)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	in, err := d.o.Abort(context.Background(), id, operator)
	if err != nil {
		t.Fatal(err)
	}
	// stock's action was sent: it is compensated too (the barrier makes a
	// compensation of an action that never ran a no-op).
	if c := d.last(id); in.Status != saga.StatusCompensating || c.Step != "stock" || c.Op != "compensation" {
		t.Fatalf("after abort: %s %+v", in.Status, c)
	}
	if _, err := d.o.Abort(context.Background(), id, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("second abort: %v", err)
	}
}

func TestDeadline(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Deadline = time.Hour
		s.Steps[0].Timeout = 10 * time.Hour
	})
	id := "o-deadline"
	start(t, d.testBundle, def, id, 5)
	d.tick(time.Hour)
	in := d.get(id)
	if c := d.last(id); in.Status != saga.StatusCompensating || in.LastError != "deadline exceeded" || c.Op != "compensation" || c.Step != "credit" {
		t.Fatalf("after the deadline: %s %q %+v", in.Status, in.LastError, c)
	}
}

func TestStartIsIdempotentByID(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	first := start(t, d.testBundle, def, "o-idem", 5)
	if first.Existing {
		t.Fatal("first start reported existing")
	}
	again := start(t, d.testBundle, def, "o-idem", 5)
	if !again.Existing || again.Revision != first.Revision || len(d.commands("o-idem")) != 1 {
		t.Fatalf("second start: existing %v, %d commands", again.Existing, len(d.commands("o-idem")))
	}
	if _, err := saga.Start(ctx, d.o, def, "o-idem", order{ID: "o-idem", Amount: 6}); !errors.Is(err, saga.ErrAlreadyStarted) {
		t.Fatalf("start with other data: %v", err)
	}
	if _, err := saga.Start(ctx, d.o, def, "bad\x00id", order{}); !errors.Is(err, saga.ErrInvalidID) {
		t.Fatalf("start with a NUL in the id: %v", err)
	}
	// StartTx commits with the caller's transaction, or not at all.
	tx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := saga.StartTx(ctx, tx, d.o, def, "o-rolled-back", order{ID: "o-rolled-back"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.o.Get(ctx, "o-rolled-back"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("rolled-back start: %v", err)
	}
	if n := len(d.commands("o-rolled-back")); n != 0 {
		t.Fatalf("rolled-back start left %d commands", n)
	}
	err = pgx.BeginFunc(ctx, d.db.Pool, func(tx pgx.Tx) error {
		_, err := saga.StartTx(ctx, tx, d.o, def, "", order{ID: "generated"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A saga whose first step is local runs it in the starting transaction:
// once, even when started twice, and not at all if the caller rolls back.
func TestStartRunsLeadingLocalStepOnce(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[0], s.Steps[1] = s.Steps[1], s.Steps[0] // approve (local) first, then credit
	})
	ctx := context.Background()
	in := start(t, d.testBundle, def, "o-local", 5)
	if in.Steps["approve"].Status != saga.StepDone || in.Step != "credit" || in.Revision != 1 {
		t.Fatalf("after start: step %s, approve %+v, revision %d", in.Step, in.Steps["approve"], in.Revision)
	}
	if again := start(t, d.testBundle, def, "o-local", 5); !again.Existing {
		t.Fatal("second start not reported as existing")
	}
	if _, err := saga.Start(ctx, d.o, def, "o-local", order{ID: "o-local", Amount: 7}); !errors.Is(err, saga.ErrAlreadyStarted) {
		t.Fatalf("other data: %v", err)
	}
	if got := d.effects("o-local"); !slices.Equal(got, []string{"approve:do"}) {
		t.Fatalf("effects %v", got)
	}
	tx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := saga.StartTx(ctx, tx, d.o, def, "o-local-rb", order{ID: "o-local-rb"}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if got := d.effects("o-local-rb"); len(got) != 0 {
		t.Fatalf("rolled-back start left effects %v", got)
	}
	d.reply("o-local", d.last("o-local"), core.OutcomeSuccess)
	d.reply("o-local", d.last("o-local"), core.OutcomeSuccess)
	if in := d.get("o-local"); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
}
