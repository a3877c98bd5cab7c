package sagatest_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// setup is a harness with the order participants and sagas started.
func setup(t *testing.T, n int, faults ...sagatest.Fault) *sagatest.H {
	t.Helper()
	return setupWith(t, sagatest.Config{Faults: sagatest.Script(faults...), Effects: effects}, n)
}

func setupWith(t *testing.T, cfg sagatest.Config, n int) *sagatest.H {
	t.Helper()
	h := sagatest.New(t, cfg)
	if err := orderScenario(n, false)(h); err != nil {
		t.Fatal(err)
	}
	return h
}

func status(t *testing.T, h *sagatest.H, id string) saga.Status {
	t.Helper()
	in, err := h.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return in.Status
}

func TestNoFaults(t *testing.T) {
	t.Parallel()
	h := setup(t, 3)
	r := h.Run(t)
	for id, want := range map[string]saga.Status{"o1": saga.StatusCompleted, "o2": saga.StatusCompleted, "o3": saga.StatusCompensated} {
		if got := status(t, h, id); got != want {
			t.Errorf("saga %s: %s, want %s\n%s", id, got, want, r)
		}
	}
	if len(r.Faults) != 0 || r.Restarts != 0 {
		t.Fatalf("faults without a plan: %v", r)
	}
}

// Each fault, scripted, on a saga that completes anyway; the invariants
// hold (Run fails the test otherwise) and the fault left its trace.
func TestEachFaultRecovers(t *testing.T) {
	t.Parallel()
	creditReply := sagatest.Event{Kind: sagatest.Reply, Saga: "o1", Step: "credit", Op: core.OperationAction}
	stockCmd := sagatest.Event{Kind: sagatest.Command, Saga: "o1", Step: "stock"}
	for _, tc := range []struct {
		name  string
		fault sagatest.Fault
		// history holds an event the fault must cause.
		history string
	}{
		{"drop command", sagatest.Drop.On(stockCmd), "timeout"},
		{"drop reply", sagatest.Drop.On(creditReply), "timeout"},
		{"delay reply past its timeout", sagatest.Delay.On(creditReply), "backoff"},
		{"delay reply past its retry", sagatest.DelayFor(2, creditReply), "fenced"},
		{"duplicate command", sagatest.Duplicate.On(stockCmd), ""},
		{"duplicate reply", sagatest.Duplicate.On(creditReply), ""},
		{"reorder", sagatest.Reorder.On(stockCmd), ""},
		{"participant error ×3", sagatest.FailTimes(3, stockCmd), ""},
		{"crash after load", sagatest.CrashAt(sagatest.CrashLoaded, creditReply), ""},
		{"crash before commit", sagatest.CrashAt(sagatest.CrashBeforeCommit, creditReply), ""},
		{"crash after commit", sagatest.CrashAt(sagatest.CrashAfterCommit, creditReply), ""},
		{"crash in a timer", sagatest.CrashAt(sagatest.CrashBeforeCommit, sagatest.Event{Kind: sagatest.Timer, Saga: "o1"}), "timeout"},
	} {
		for _, batched := range []bool{false, true} {
			name := tc.name
			if batched {
				name += " batched"
			}
			t.Run(name, func(t *testing.T) {
				faults := []sagatest.Fault{tc.fault}
				if tc.fault.At.Kind == sagatest.Timer {
					// A timer to crash in: the stock command is lost first.
					faults = append([]sagatest.Fault{sagatest.Drop.On(stockCmd)}, faults...)
				}
				h := setupWith(t, sagatest.Config{Faults: sagatest.Script(faults...), Effects: effects, BatchReplies: batched}, 2)
				start := time.Now()
				r := h.Run(t)
				t.Logf("%s: %d events, clock +%s, %s", tc.name, r.Events, r.Elapsed, time.Since(start))
				if len(r.Faults) != len(faults) {
					t.Fatalf("the fault did not fire:\n%s", r)
				}
				if tc.fault.Kind == sagatest.Crash && r.Restarts != 1 {
					t.Fatalf("%d restarts, want 1\n%s", r.Restarts, r)
				}
				for _, id := range []string{"o1", "o2"} {
					if got := status(t, h, id); got != saga.StatusCompleted {
						t.Fatalf("saga %s: %s\n%s", id, got, r)
					}
				}
				if tc.history != "" {
					hist, err := h.History("o1")
					if err != nil {
						t.Fatal(err)
					}
					if !slices.ContainsFunc(hist, func(e saga.HistoryEntry) bool { return e.Event == tc.history }) {
						t.Fatalf("no %q in the history of o1:\n%s", tc.history, r)
					}
				}
			})
		}
	}
}

// A broken participant (no barrier) must make the invariant checks fail,
// and the explorer must shrink the failure to one fault.
func TestBrokenParticipantIsCaught(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"enumerate", "random"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			cfg := sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects}, Seed: 1, Runs: 200}
			if mode == "enumerate" {
				cfg.Enumerate, cfg.Runs = true, -1
			}
			f, err := sagatest.FindFailure(context.Background(), cfg, orderScenario(2, true))
			if err != nil {
				t.Fatal(err)
			}
			if f == nil {
				t.Fatal("the broken participant passed every run")
			}
			t.Logf("found after %d runs: %s", f.Runs, f)
			if len(f.Faults) != 1 {
				t.Fatalf("shrunk to %d faults, want 1", len(f.Faults))
			}
			if !slices.ContainsFunc(f.Report.Violations, func(v string) bool { return strings.Contains(v, "step credit: effect:") }) {
				t.Fatalf("violations do not name the credit effect: %v", f.Report.Violations)
			}
			// The shrunk schedule repeats: the failure is deterministic.
			h := sagatest.New(t, sagatest.Config{Faults: sagatest.Script(f.Faults...), Effects: effects})
			if err := orderScenario(2, true)(h); err != nil {
				t.Fatal(err)
			}
			if r := h.RunE(); len(r.Violations) == 0 {
				t.Fatalf("the shrunk schedule passes on replay:\n%s", r)
			}
		})
	}
}

// The invariant checks fail for a broken participant without any fault
// injected? No: without faults it behaves; the bug needs a fault to show.
func TestBrokenParticipantPassesWithoutFaults(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, sagatest.Config{Effects: effects})
	if err := orderScenario(2, true)(h); err != nil {
		t.Fatal(err)
	}
	h.Run(t)
}

// The same seed gives the same run, event for event.
func TestSameSeedSameRun(t *testing.T) {
	t.Parallel()
	var traces [2][]string
	for i := range traces {
		h := sagatest.New(t, sagatest.Config{Effects: effects,
			Faults: sagatest.Random(42, sagatest.RandomOptions{Rate: 0.3})})
		if err := orderScenario(3, false)(h); err != nil {
			t.Fatal(err)
		}
		r := h.Run(t)
		if len(r.Faults) == 0 {
			t.Fatal("seed 42 at rate 0.3 injected no fault")
		}
		traces[i] = r.Trace
	}
	if !slices.Equal(traces[0], traces[1]) {
		t.Fatalf("two runs of one seed differ:\n%s\n---\n%s", strings.Join(traces[0], "\n"), strings.Join(traces[1], "\n"))
	}
}

// A correct participant passes 500 random scenarios of three sagas each.
func TestRandomScenarios(t *testing.T) {
	t.Parallel()
	// Runs are latency-bound (each waits on PostgreSQL), so four schemas
	// at once finish about twice as fast as two, even on two cores.
	runs, workers := 500, 4
	if testing.Short() {
		runs = 50
	}
	if w, err := strconv.Atoi(os.Getenv("SAGATEST_WORKERS")); err == nil {
		workers = w
	}
	start := time.Now()
	sagatest.Explore(t, sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects}, Runs: runs, Workers: workers}, orderScenario(3, false))
	t.Logf("%d random runs in %s", runs, time.Since(start))
}

// Every single fault at every event of a run with a saga that completes
// and one that compensates.
func TestEverySingleFault(t *testing.T) {
	t.Parallel()
	sagatest.Explore(t, sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects}, Enumerate: true, Runs: -1}, orders(false, 10, 500))
}

// The orchestrator crashes at each hook point of every reply and timer of
// a run full of timeouts, and a new one always finishes the sagas: the
// deterministic twin of the saga package's SIGKILL test.
func TestCrashAnywhere(t *testing.T) {
	t.Parallel()
	crashOnly := sagatest.RandomOptions{Kinds: []sagatest.FaultKind{sagatest.Crash}}
	var mu sync.Mutex
	runs := 0
	scenario := func(h *sagatest.H) error {
		return orders(false, 10, 500)(h)
	}
	lose := func(id string) sagatest.Fault {
		return sagatest.Drop.On(sagatest.Event{Kind: sagatest.Command, Saga: id, Step: "stock", Op: core.OperationAction, Attempt: 1})
	}
	sagatest.Explore(t, sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects,
		// Each saga's first stock command is lost, so that timers fire too.
		Faults: sagatest.Script(lose("o1"), lose("o2"))}, Enumerate: true, Runs: 30, Random: crashOnly,
		Log: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			runs++
			if args[3].(int) < 2 { // faults: the two drops at least
				t.Errorf("the drops did not fire: "+format, args...)
			}
		}}, scenario)
	if runs < 50 { // 1 without crashes, ~20 enumerated crashes, 30 random
		t.Fatalf("%d runs", runs)
	}
	t.Logf("%d runs", runs)
}

// A step whose command is lost on every attempt times out three times
// (five timers: three timeouts and the two backoffs between them), then
// the saga compensates: the empty compensation of the step that never ran
// succeeds, the credit is released, and a late action after its
// compensation is cancelled, not applied.
func TestTimeoutsThenCompensation(t *testing.T) {
	t.Parallel()
	stock := func(attempt int) sagatest.Event {
		return sagatest.Event{Kind: sagatest.Command, Saga: "o1", Step: "stock", Op: core.OperationAction, Attempt: attempt}
	}
	h := setup(t, 1, sagatest.DelayFor(5, stock(1)), sagatest.Drop.On(stock(2)), sagatest.Drop.On(stock(3)))
	r := h.Run(t)
	if got := status(t, h, "o1"); got != saga.StatusCompensated {
		t.Fatalf("saga o1: %s\n%s", got, r)
	}
	eff, err := effects(context.Background(), h, "o1")
	if err != nil {
		t.Fatal(err)
	}
	if eff["credit"] != 0 || eff["stock"] != 0 {
		t.Fatalf("effects %v, want none left", eff)
	}
	var outcome string
	var empty bool
	err = h.Pool().QueryRow(context.Background(), `SELECT a.outcome, c.empty FROM `+h.Table("compensation_barrier")+` a JOIN `+
		h.Table("compensation_barrier")+` c ON c.saga_id = a.saga_id AND c.step = a.step AND c.operation = 'compensation'
 WHERE a.saga_id = 'o1' AND a.step = 'stock' AND a.operation = 'action'`).Scan(&outcome, &empty)
	if err != nil {
		t.Fatal(err)
	}
	if outcome != core.OutcomeCancelled || !empty {
		t.Fatalf("stock's barrier: action %q, compensation empty %t; want a cancelled late action and an empty compensation\n%s", outcome, empty, r)
	}
	if !slices.ContainsFunc(r.Trace, func(l string) bool { return strings.Contains(l, "reply o1 stock/action#1 cancelled") }) {
		t.Fatalf("the late action's cancelled reply is not in the trace\n%s", r)
	}
}

// A user's saga test with faults, from a fresh schema to the checked end.
func TestUserTestIsFast(t *testing.T) {
	t.Parallel()
	start := time.Now()
	h := setup(t, 1,
		sagatest.Drop.On(sagatest.Event{Kind: sagatest.Reply, Step: "stock"}),
		sagatest.Duplicate.On(sagatest.Event{Kind: sagatest.Command, Step: "ship"}),
		sagatest.CrashAt(sagatest.CrashBeforeCommit, sagatest.Event{Kind: sagatest.Reply, Step: "credit"}))
	setupTook := time.Since(start)
	r := h.Run(t)
	if got := status(t, h, "o1"); got != saga.StatusCompleted || len(r.Faults) != 3 {
		t.Fatalf("saga o1: %s\n%s", got, r)
	}
	t.Logf("schema and setup %s, run with %d faults %s (clock moved %s)", setupTook, len(r.Faults), time.Since(start)-setupTook, r.Elapsed)
}

// With BatchReplies the replies of a wave share one HandleReplies call.
func TestBatchedReplies(t *testing.T) {
	t.Parallel()
	h := setupWith(t, sagatest.Config{Effects: effects, BatchReplies: true}, 3)
	r := h.Run(t)
	if !slices.ContainsFunc(r.Trace, func(l string) bool { return strings.Contains(l, "delivered 3 replies in one transaction") }) {
		t.Fatalf("no three replies in one batch:\n%s", r)
	}
}

// The batched reply path (HandleReplies) under random faults.
func TestRandomScenariosBatched(t *testing.T) {
	t.Parallel()
	runs := 60
	if testing.Short() {
		runs = 20
	}
	sagatest.Explore(t, sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects, BatchReplies: true}, Runs: runs}, orderScenario(3, false))
}
