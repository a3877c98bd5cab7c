package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

var alice = saga.Actor{Operator: "alice", Reason: "the payment provider is down"}

// pausedRunning starts a saga, answers its credit step and pauses it while
// it waits for stock's attempt 1 (timeout 1s), which it returns.
func pausedRunning(t *testing.T, d *driver, def *saga.Definition[order], id string) cmd {
	t.Helper()
	stock := stockRunning(t, d, def, id)
	in, err := d.o.Pause(context.Background(), id, alice)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusPaused || in.NextWakeupAt != nil {
		t.Fatalf("paused: status %s, next wake-up %v", in.Status, in.NextWakeupAt)
	}
	return stock
}

// A paused saga fires no timer: its step timeout (and deadline) pass while
// paused and nothing happens; on resume both are pushed by the time it was
// paused, and the timeout fires that much later.
func TestPausedSagaFiresNoTimer(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) { s.Deadline = time.Minute })
	id := "pause-timer"
	stockRunning(t, d, def, id)
	before := d.get(id)
	due, deadline := *before.Steps["stock"].Due, *before.DeadlineAt
	if _, err := d.o.Pause(context.Background(), id, alice); err != nil {
		t.Fatal(err)
	}
	d.tick(2 * time.Minute) // past the step's timeout and the saga's deadline
	in := d.get(id)
	if in.Status != saga.StatusPaused || in.Steps["stock"].Status != saga.StepRunning || len(d.commands(id)) != 2 {
		t.Fatalf("while paused: %s, stock %+v, %d commands", in.Status, in.Steps["stock"], len(d.commands(id)))
	}
	if n := len(historyEvents(t, d.o, id, "timeout")) + len(historyEvents(t, d.o, id, "deadline")); n != 0 {
		t.Fatalf("%d timer events while paused", n)
	}
	in, err := d.o.Resume(context.Background(), id, saga.Actor{Operator: "bob", Reason: "the provider is back"})
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusRunning {
		t.Fatalf("resumed: %s", in.Status)
	}
	if got, want := *in.Steps["stock"].Due, due.Add(2*time.Minute); !got.Equal(want) {
		t.Fatalf("step due %s after resume, want %s (pushed by the paused time)", got, want)
	}
	if got, want := *in.DeadlineAt, deadline.Add(2*time.Minute); !got.Equal(want) {
		t.Fatalf("deadline %s after resume, want %s", got, want)
	}
	if in.NextWakeupAt == nil || !in.NextWakeupAt.Equal(due.Add(2*time.Minute)) {
		t.Fatalf("next wake-up %v", in.NextWakeupAt)
	}
	d.tick(900 * time.Millisecond) // the step had 1s left when paused
	if in := d.get(id); in.Steps["stock"].Status != saga.StepRunning {
		t.Fatalf("the timeout fired early: stock %+v", in.Steps["stock"])
	}
	d.tick(100 * time.Millisecond)
	if in := d.get(id); in.Steps["stock"].Status != saga.StepBackoff {
		t.Fatalf("the pushed timeout did not fire: stock %+v", in.Steps["stock"])
	}
	// Who and why, both ways.
	p, r := historyEvents(t, d.o, id, "paused"), historyEvents(t, d.o, id, "resumed")
	if len(p) != 1 || p[0].Actor != "alice" || p[0].Reason != alice.Reason || p[0].Status != saga.StatusPaused {
		t.Fatalf("paused lines %+v", p)
	}
	if len(r) != 1 || r[0].Actor != "bob" || r[0].Reason != "the provider is back" || r[0].Status != saga.StatusRunning {
		t.Fatalf("resumed lines %+v", r)
	}
	var detail struct {
		PausedFor string `json:"paused_for"`
	}
	if err := json.Unmarshal(r[0].Detail, &detail); err != nil || detail.PausedFor != "2m0s" {
		t.Fatalf("resumed detail %s (%v)", r[0].Detail, err)
	}
	var ops []string
	for _, h := range historyEvents(t, d.o, id, "operator") {
		ops = append(ops, h.Actor+":"+string(h.Detail))
	}
	if !slices.Equal(ops, []string{`alice:{"action": "pause"}`, `bob:{"action": "resume"}`}) {
		t.Fatalf("operator lines %q", ops)
	}
}

// A reply that arrives while the saga is paused is acknowledged and held,
// the saga unchanged (its revision too); a redelivery of it is a
// duplicate; on resume it is applied once and the saga goes on.
func TestPausedSagaHoldsRepliesUntilResume(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "pause-hold"
	stock := pausedRunning(t, d, def, id)
	paused := d.get(id)
	msg := replyMsg(id, stock, core.OutcomeSuccess, "", "")
	d.deliver(msg)
	d.deliver(msg) // redelivered: the inbox's mark was kept with the held reply
	in := d.get(id)
	if in.Status != saga.StatusPaused || in.Revision != paused.Revision || in.Steps["stock"].Status != saga.StepRunning {
		t.Fatalf("after the reply: %s revision %d (was %d), stock %+v", in.Status, in.Revision, paused.Revision, in.Steps["stock"])
	}
	if h := historyEvents(t, d.o, id, "held"); len(h) != 1 || h[0].Step != "stock" || h[0].Status != saga.StatusPaused {
		t.Fatalf("held lines %+v", h)
	}
	if n := fencedCount(t, d.o, id); n != 0 {
		t.Fatalf("%d fenced", n)
	}
	in, err := d.o.Resume(context.Background(), id, alice)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompleted {
		t.Fatalf("after resume: %s (%s)", in.Status, in.LastError)
	}
	if n := len(historyEvents(t, d.o, id, "reply")); n != 2 { // credit's and stock's
		t.Fatalf("%d replies applied, want 2", n)
	}
	// Nothing is left held: another pause and resume applies nothing more.
	var held int
	if err := d.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+d.tbl("saga_held_reply")).Scan(&held); err != nil || held != 0 {
		t.Fatalf("%d held replies left (%v)", held, err)
	}
}

// Held replies are applied in arrival order: a late failure of an earlier
// attempt held before the success is fenced as it would have been, and the
// step's success applied once.
func TestHeldRepliesApplyInOrder(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "pause-order"
	stock := stockRunning(t, d, def, id)
	if _, err := d.o.Pause(context.Background(), id, alice); err != nil {
		t.Fatal(err)
	}
	d.deliver(replyMsg(id, stock, core.OutcomeSuccess, "", ""))
	d.deliver(replyMsg(id, stock, core.OutcomeFailure, "too late", "")) // after the success: fenced
	if _, err := d.o.Resume(context.Background(), id, alice); err != nil {
		t.Fatal(err)
	}
	in := d.get(id)
	if in.Status != saga.StatusCompleted {
		t.Fatalf("after resume: %s (%s)", in.Status, in.LastError)
	}
	if n := fencedCount(t, d.o, id); n != 1 {
		t.Fatalf("%d fenced, want the second reply", n)
	}
}

// Pause and resume are refused in the wrong states, with nothing changed.
func TestPauseResumeRefusedInWrongStates(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, saga.ErrActionNotAllowed) {
			t.Fatalf("%s: %v, want ErrActionNotAllowed", what, err)
		}
	}
	stockRunning(t, d, def, "wrong-1")
	_, err := d.o.Resume(ctx, "wrong-1", alice)
	refused("resume of a running saga", err)
	_, err = d.o.Pause(ctx, "wrong-1", saga.Actor{Operator: "alice"})
	refused("pause without a reason", err)
	if _, err := d.o.Pause(ctx, "wrong-1", alice); err != nil {
		t.Fatal(err)
	}
	rev := d.get("wrong-1").Revision
	_, err = d.o.Pause(ctx, "wrong-1", alice)
	refused("pause of a paused saga", err)
	for _, act := range []func(context.Context, string, saga.Actor) (*saga.Instance, error){d.o.Retry, d.o.Skip, d.o.Abort, d.o.MarkCompensated} {
		_, err = act(ctx, "wrong-1", alice)
		refused("another action on a paused saga", err)
	}
	if got := d.get("wrong-1"); got.Revision != rev || got.Status != saga.StatusPaused {
		t.Fatalf("a refused action changed the saga: %s revision %d (was %d)", got.Status, got.Revision, rev)
	}
	// Ended and stuck sagas cannot be paused.
	start(t, d.testBundle, def, "wrong-2", 1)
	d.reply("wrong-2", d.last("wrong-2"), core.OutcomeFailure) // compensated at once
	_, err = d.o.Pause(ctx, "wrong-2", alice)
	refused("pause of an ended saga", err)
	_, err = d.o.Resume(ctx, "wrong-2", alice)
	refused("resume of an ended saga", err)
	_, err = d.o.Resume(ctx, "nobody", alice)
	if !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("resume of an unknown saga: %v", err)
	}
}

// Through the Operator (no definitions): pause and resume are requests the
// running orchestrator applies, checked against the state when recorded,
// with who and why. A pause request still applies after the saga moved on
// (a reply came meanwhile); a resume request on a running saga is refused
// when recorded.
func TestOperatorPauseResume(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	p, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock})
	if err != nil {
		t.Fatal(err)
	}
	id := "op-pause"
	start(t, d.testBundle, def, id, 1)
	if _, err := p.Request(ctx, id, saga.ActionResume, alice); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("resume request of a running saga: %v", err)
	}
	if _, err := p.Request(ctx, id, saga.ActionPause, alice); err != nil {
		t.Fatal(err)
	}
	d.reply(id, d.last(id), core.OutcomeSuccess) // credit: the saga moves to stock before the request applies
	d.tick(0)
	in := d.get(id)
	if in.Status != saga.StatusPaused || in.Step != "stock" || in.Request != nil {
		t.Fatalf("after the pause request: %s at %s, request %+v", in.Status, in.Step, in.Request)
	}
	stock := d.last(id)
	d.reply(id, stock, core.OutcomeSuccess) // held
	if _, err := p.Request(ctx, id, saga.ActionResume, saga.Actor{Operator: "bob", Reason: "go on"}); err != nil {
		t.Fatal(err)
	}
	d.tick(0)
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("after the resume request: %s (%s)", in.Status, in.LastError)
	}
	if r := historyEvents(t, d.o, id, "resumed"); len(r) != 1 || r[0].Actor != "bob" || r[0].Reason != "go on" {
		t.Fatalf("resumed %+v", r)
	}
	if r := historyEvents(t, d.o, id, "operator_refused"); len(r) != 0 {
		t.Fatalf("refused %+v", r)
	}
}

// The batch path (HandleReplies, which RunBatched runs) holds the replies
// of a paused saga too, next to the replies of running sagas it applies;
// Resume applies them once.
func TestPausedSagaHoldsBatchedReplies(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	stock := pausedRunning(t, d, def, "pb-paused")
	start(t, d.testBundle, def, "pb-running", 1)
	held := replyMsg("pb-paused", stock, core.OutcomeSuccess, "", "")
	batch := []*message.Message{held, replyMsg("pb-running", d.last("pb-running"), core.OutcomeSuccess, "", ""), held}
	res, err := d.o.HandleReplies(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fenced != 0 || res.Duplicates != 1 || len(res.Poisoned) != 0 {
		t.Fatalf("batch result %+v", res)
	}
	if in := d.get("pb-paused"); in.Status != saga.StatusPaused || in.Steps["stock"].Status != saga.StepRunning {
		t.Fatalf("paused saga after the batch: %s, stock %+v", in.Status, in.Steps["stock"])
	}
	if c := d.last("pb-running"); c.Step != "stock" {
		t.Fatalf("the running saga did not go on: %+v", c)
	}
	res, err = d.o.HandleReplies(ctx, []*message.Message{held}) // redelivered
	if err != nil || res.Duplicates != 1 {
		t.Fatalf("redelivery: %+v %v", res, err)
	}
	if _, err := d.o.Resume(ctx, "pb-paused", alice); err != nil {
		t.Fatal(err)
	}
	if in := d.get("pb-paused"); in.Status != saga.StatusCompleted {
		t.Fatalf("after resume: %s", in.Status)
	}
	if n := len(historyEvents(t, d.o, "pb-paused", "reply")); n != 2 {
		t.Fatalf("%d replies applied, want 2", n)
	}
}

// End to end through the Kafka protocol, with the Router's Handler and
// with RunBatched: a saga started and paused in one transaction has its
// first command in flight; the participant's reply arrives while it is
// paused and is held (its message acknowledged: the partition goes on);
// on resume it is applied once and the saga completes, each step's effect
// once.
func TestPauseWithReplyInFlightKafka(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		name := "handler"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setupE2E(t, true)
			e.batched = batched
			def := mustDefine(t, e.spec(1, time.Minute))
			e.start(t, def)
			ctx := context.Background()
			id := "inflight-" + name
			err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				if _, err := saga.StartTx(ctx, tx, e.o, def, id, order{ID: id, Amount: 3}); err != nil {
					return err
				}
				_, err := e.o.PauseTx(ctx, tx, id, alice)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			// Another saga on the same reply topic goes on meanwhile.
			start(t, e.testBundle, def, id+"-other", 1)
			e.waitStatus(id+"-other", saga.StatusCompleted)
			deadline := time.Now().Add(60 * time.Second)
			for len(historyEvents(t, e.o, id, "held")) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("no reply held: %v", events(t, e.testBundle, id))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if in := e.waitStatus(id, saga.StatusPaused); in.Steps["credit"].Status != saga.StepRunning {
				t.Fatalf("while paused: credit %+v", in.Steps["credit"])
			}
			if _, err := e.o.Resume(ctx, id, alice); err != nil {
				t.Fatal(err)
			}
			in := e.waitStatus(id, saga.StatusCompleted)
			e.checkEffects(t, in)
			if dataOf(t, in).CreditTx != "credit-"+id {
				t.Fatalf("the held reply's payload was not applied: %s", in.Data)
			}
			if n := len(historyEvents(t, e.o, id, "reply")); n != 2 {
				t.Fatalf("%d replies applied, want 2: %v", n, events(t, e.testBundle, id))
			}
			if n := len(historyEvents(t, e.o, id, "held")); n != 1 {
				t.Fatalf("%d held", n)
			}
		})
	}
}
