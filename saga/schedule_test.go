package saga_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/millrace/millrace/saga"
)

// A saga started with StartAt exists at once as scheduled (listed so),
// sends nothing until its start time, and starts then on the timer pass
// of another orchestrator than the one that scheduled it (the first one
// stopped before the time came, as in a restart); its deadline counts from
// the actual start.
func TestScheduledStartAfterRestart(t *testing.T) {
	t.Parallel()
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock})
	spec := orderSpec(b, 1)
	spec.Deadline = time.Minute
	def := mustDefine(t, spec)
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	at := clock.Now().Add(time.Hour)
	in, err := saga.Start(ctx, b.o, def, "sched-1", order{ID: "sched-1", Amount: 2}, saga.StartAt(at))
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusScheduled || in.NextWakeupAt == nil || !in.NextWakeupAt.Equal(at) {
		t.Fatalf("scheduled: %s, next wake-up %v", in.Status, in.NextWakeupAt)
	}
	d := &driver{testBundle: b, clock: clock}
	if c := d.commands("sched-1"); len(c) != 0 {
		t.Fatalf("commands before the start: %+v", c)
	}
	list, err := b.o.List(ctx, saga.ListParams{Status: saga.StatusScheduled})
	if err != nil || len(list.Sagas) != 1 || list.Sagas[0].ID != "sched-1" {
		t.Fatalf("listed as scheduled: %+v %v", list, err)
	}
	// A repeated start returns the scheduled saga.
	again, err := saga.Start(ctx, b.o, def, "sched-1", order{ID: "sched-1", Amount: 2}, saga.StartAt(at))
	if err != nil || !again.Existing || again.Status != saga.StatusScheduled {
		t.Fatalf("repeated start: %+v %v", again, err)
	}
	// The first orchestrator runs its timer loop before the start time,
	// and stops.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.o.Run(runCtx) }()
	clock.Advance(59 * time.Minute)
	deadline := time.Now().Add(2 * time.Second) // a few of its passes at 20ms
	for time.Now().Before(deadline) {
		if got := d.get("sched-1"); got.Status != saga.StatusScheduled {
			t.Fatalf("started early: %s", got.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Another one takes over; the time comes.
	other, err := saga.New(b.db.Pool, saga.Config{Schema: b.db.Schema, Writer: b.w, Clock: clock, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Register(def); err != nil {
		t.Fatal(err)
	}
	runCtx, stop = context.WithCancel(ctx)
	defer stop()
	go func() { done <- other.Run(runCtx) }()
	clock.Advance(time.Minute)
	started := b.waitStatus("sched-1", saga.StatusRunning)
	if c := d.last("sched-1"); c.Step != "credit" || c.Attempt != 1 {
		t.Fatalf("first command %+v", c)
	}
	if started.DeadlineAt == nil || !started.DeadlineAt.Equal(at.Add(time.Minute)) {
		t.Fatalf("deadline %v, want a minute from the start %s", started.DeadlineAt, at)
	}
	ev := events(t, b, "sched-1")
	if len(ev) < 3 || ev[0] != "scheduled" || ev[1] != "started" || ev[2] != "command:credit" {
		t.Fatalf("history %v", ev)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Abort cancels a scheduled saga, directly or through an Operator
// request: it ends compensated and never starts; other actions are
// refused while it is scheduled. A start time already past starts at once.
func TestScheduledSagaCancelled(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	at := d.clock.Now().Add(time.Hour)
	for _, id := range []string{"cancel-1", "cancel-2"} {
		if _, err := saga.Start(ctx, d.o, def, id, order{ID: id, Amount: 1}, saga.StartAt(at)); err != nil {
			t.Fatal(err)
		}
	}
	for _, act := range []func(context.Context, string, saga.Actor) (*saga.Instance, error){d.o.Retry, d.o.Skip, d.o.Pause, d.o.Resume, d.o.MarkCompensated} {
		if _, err := act(ctx, "cancel-1", alice); !errors.Is(err, saga.ErrActionNotAllowed) {
			t.Fatalf("another action on a scheduled saga: %v", err)
		}
	}
	in, err := d.o.Abort(ctx, "cancel-1", alice)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompensated || in.NextWakeupAt != nil || in.EndedAt == nil {
		t.Fatalf("cancelled: %s, next wake-up %v", in.Status, in.NextWakeupAt)
	}
	p, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Request(ctx, "cancel-2", saga.ActionAbort, alice); err != nil {
		t.Fatal(err)
	}
	d.tick(2 * time.Hour) // applies the request; past the start time
	for _, id := range []string{"cancel-1", "cancel-2"} {
		if in := d.get(id); in.Status != saga.StatusCompensated {
			t.Fatalf("%s after its start time: %s", id, in.Status)
		}
		if c := d.commands(id); len(c) != 0 {
			t.Fatalf("%s sent %+v", id, c)
		}
		if h := historyEvents(t, d.o, id, "cancelled"); len(h) != 1 {
			t.Fatalf("%s: history %v", id, events(t, d.testBundle, id))
		}
		if h := historyEvents(t, d.o, id, "started"); len(h) != 0 {
			t.Fatalf("%s started", id)
		}
	}
	past, err := saga.Start(ctx, d.o, def, "past", order{ID: "past", Amount: 1}, saga.StartAt(d.clock.Now().Add(-time.Minute)))
	if err != nil || past.Status != saga.StatusRunning || d.last("past").Step != "credit" {
		t.Fatalf("a start time in the past: %+v %v", past, err)
	}
}
