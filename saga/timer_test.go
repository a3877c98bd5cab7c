package saga_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/saga"
)

// failingFor returns a Hook that fails at sagahook.Loaded for saga id while
// *on is set, and counts the failures.
func failingFor(id string, on *atomic.Bool, count *atomic.Int32) sagahook.Func {
	return func(ctx context.Context, p sagahook.Point, sagaID string) error {
		if sagaID == id && p == sagahook.Loaded && on.Load() {
			count.Add(1)
			return errors.New("injected failure")
		}
		return nil
	}
}

func countEvents(t *testing.T, o *saga.Orchestrator, id, event string) int {
	n := 0
	for _, h := range historyOf(t, o, id) {
		if h.Event == event {
			n++
		}
	}
	return n
}

// One saga whose timer fails technically is rolled back alone: the other
// sagas' timers of the pass fire. It is tried again on later passes (with
// the failures counted in its history, across orchestrator restarts) and
// parked as stuck with the reason after MaxTimerFailures in a row.
func TestTimerFailureOfOneSagaDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	var on atomic.Bool
	var count atomic.Int32
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock, hook: failingFor("bad", &on, &count)})
	def := mustDefine(t, orderSpec(b, 1))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock}
	start(t, b, def, "bad", 1) // due first: claimed first
	clock.Advance(time.Millisecond)
	start(t, b, def, "good", 1)
	on.Store(true)

	clock.Advance(time.Second) // both credit commands time out
	n, err := b.o.RunDue(context.Background())
	if err == nil || !strings.Contains(err.Error(), "injected failure") {
		t.Fatalf("RunDue error %v", err)
	}
	if n != 1 {
		t.Fatalf("woke %d sagas, want 1", n)
	}
	if st := d.get("good").Steps["credit"]; st.Status != saga.StepBackoff {
		t.Fatalf("good's timer did not fire: %+v", st)
	}
	if in := d.get("bad"); in.Status != saga.StatusRunning || in.Steps["credit"].Status != saga.StepRunning {
		t.Fatalf("bad changed: %s %+v", in.Status, in.Steps["credit"])
	}
	if got := countEvents(t, b.o, "bad", "timer_failed"); got != 1 {
		t.Fatalf("timer_failed lines %d", got)
	}
	// The failing saga's next wake-up moved back: the next pass at the
	// same time does not claim it again.
	if _, err := b.o.RunDue(context.Background()); err != nil || count.Load() != 1 {
		t.Fatalf("claimed again at once: %v, %d failures", err, count.Load())
	}

	// A restarted orchestrator (a new one) goes on counting.
	o2, err := saga.New(b.db.Pool, saga.Config{Schema: b.db.Schema, Writer: b.w, Clock: clock,
		Hook: failingFor("bad", &on, &count), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := o2.Register(def); err != nil {
		t.Fatal(err)
	}
	for pass := 0; pass < 20 && d.get("bad").Status != saga.StatusStuck; pass++ {
		clock.Advance(time.Second)
		_, _ = o2.RunDue(context.Background())
	}
	in := d.get("bad")
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "timer failed 5 times in a row") ||
		!strings.Contains(in.LastError, "injected failure") || in.NextWakeupAt != nil {
		t.Fatalf("bad: %s %q, next wake-up %v", in.Status, in.LastError, in.NextWakeupAt)
	}
	if count.Load() != 5 || countEvents(t, b.o, "bad", "timer_failed") != 5 {
		t.Fatalf("%d failures, %d timer_failed lines", count.Load(), countEvents(t, b.o, "bad", "timer_failed"))
	}
	// Parked, it is claimed no more; an operator's Retry resumes it.
	on.Store(false)
	clock.Advance(time.Hour)
	d.tick(0)
	if count.Load() != 5 {
		t.Fatalf("a stuck saga's timer ran")
	}
	if in, err := o2.Retry(context.Background(), "bad", operator); err != nil || in.Status != saga.StatusRunning {
		t.Fatalf("retry: %v", err)
	}
}

// An operator request that fails technically is rolled back alone: the
// other requests of the pass are applied; it stays pending, and is
// dropped (recorded as operator_refused) after MaxTimerFailures in a row.
func TestOperatorRequestFailureDoesNotStopTheOthers(t *testing.T) {
	t.Parallel()
	var on atomic.Bool
	var count atomic.Int32
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock, hook: failingFor("rb", &on, &count)})
	def := mustDefine(t, orderSpec(b, 1))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock}
	start(t, b, def, "rb", 1)
	start(t, b, def, "ra", 1)
	p, err := saga.New(b.db.Pool, saga.Config{Schema: b.db.Schema, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"rb", "ra"} {
		if _, err := p.Request(context.Background(), id, saga.ActionAbort, operator); err != nil {
			t.Fatal(err)
		}
	}
	on.Store(true)
	n, err := b.o.RunDue(context.Background())
	if err == nil || !strings.Contains(err.Error(), "injected failure") || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	if in := d.get("ra"); in.Status != saga.StatusCompensating || in.Request != nil {
		t.Fatalf("ra: %s, request %+v", in.Status, in.Request)
	}
	if in := d.get("rb"); in.Status != saga.StatusRunning || in.Request == nil {
		t.Fatalf("rb: %s, request %+v", in.Status, in.Request)
	}
	for pass := 0; pass < 20 && d.get("rb").Request != nil; pass++ {
		_, _ = b.o.RunDue(context.Background())
	}
	if in := d.get("rb"); in.Request != nil || in.Status != saga.StatusRunning || count.Load() != 5 {
		t.Fatalf("rb: %s, request %+v, %d failures", in.Status, in.Request, count.Load())
	}
	if got := countEvents(t, b.o, "rb", "operator_failed"); got != 4 {
		t.Fatalf("operator_failed lines %d", got)
	}
	h := historyOf(t, b.o, "rb")
	if last := h[len(h)-1]; last.Event != "operator_refused" || !strings.Contains(string(last.Detail), "failed 5 times in a row") {
		t.Fatalf("last history line %+v (%s)", last, last.Detail)
	}
}

// The timer pass claims only the sagas of the types and versions it has
// registered: another service's sagas on the same schema, and another
// version's during a rolling deploy, are left to their own orchestrator
// (not parked as "not registered").
func TestTimersClaimOnlyRegisteredTypes(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-mine"
	start(t, d.testBundle, def, id, 1)
	other := orderSpec(d.testBundle, 1)
	other.Type = "invoice"
	for _, reg := range []saga.Registrable{mustDefine(t, other), mustDefine(t, orderSpec(d.testBundle, 2))} {
		o2, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock})
		if err != nil {
			t.Fatal(err)
		}
		if err := o2.Register(reg); err != nil {
			t.Fatal(err)
		}
		d.clock.Advance(time.Second) // the credit command times out
		if n, err := o2.RunDue(context.Background()); err != nil || n != 0 {
			t.Fatalf("another orchestrator woke %d: %v", n, err)
		}
		if in := d.get(id); in.Status != saga.StatusRunning || in.Steps["credit"].Status != saga.StepRunning {
			t.Fatalf("another orchestrator touched the saga: %s %q", in.Status, in.LastError)
		}
	}
	d.tick(0)
	if st := d.get(id).Steps["credit"]; st.Status != saga.StepBackoff {
		t.Fatalf("its own orchestrator did not fire the timer: %+v", st)
	}
}
