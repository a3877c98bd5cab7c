package sagatest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// A scenario pauses a saga at an event and resumes it: the reply that
// arrives meanwhile is held and applied on resume, and the invariants
// hold, one reply per transaction and batched; a random exploration with
// pauses among the faults keeps them too.
func TestPauseFault(t *testing.T) {
	t.Parallel()
	creditReply := sagatest.Event{Kind: sagatest.Reply, Saga: "o1", Step: "credit", Op: core.OperationAction}
	stockCmd := sagatest.Event{Kind: sagatest.Command, Saga: "o1", Step: "stock"}
	for _, tc := range []struct {
		name    string
		fault   sagatest.Fault
		history []string
	}{
		{"pause at a reply", sagatest.Pause.On(creditReply), []string{"paused", "held", "resumed"}},
		{"pause for two timers at a command", sagatest.PauseFor(2, stockCmd), []string{"paused", "resumed"}},
	} {
		for _, batched := range []bool{false, true} {
			name := tc.name
			if batched {
				name += " batched"
			}
			t.Run(name, func(t *testing.T) {
				h := setupWith(t, sagatest.Config{Faults: sagatest.Script(tc.fault), Effects: effects, BatchReplies: batched}, 2)
				r := h.Run(t)
				if len(r.Faults) != 1 {
					t.Fatalf("the pause did not fire:\n%s", r)
				}
				for _, id := range []string{"o1", "o2"} {
					if got := status(t, h, id); got != saga.StatusCompleted {
						t.Fatalf("saga %s: %s\n%s", id, got, r)
					}
				}
				hist, err := h.History("o1")
				if err != nil {
					t.Fatal(err)
				}
				for _, want := range tc.history {
					if !slices.ContainsFunc(hist, func(e saga.HistoryEntry) bool { return e.Event == want }) {
						t.Fatalf("no %q in the history of o1:\n%s", want, r)
					}
				}
			})
		}
	}
	t.Run("explore", func(t *testing.T) {
		cfg := sagatest.ExploreConfig{Config: sagatest.Config{Effects: effects}, Seed: 7, Runs: 20}
		cfg.Random = sagatest.RandomOptions{Kinds: append(slices.Clone(sagatest.AllFaults), sagatest.Pause)}
		f, err := sagatest.FindFailure(context.Background(), cfg, orderScenario(2, false))
		if err != nil {
			t.Fatal(err)
		}
		if f != nil {
			t.Fatalf("a run with pauses broke an invariant: %s", f)
		}
	})
}
