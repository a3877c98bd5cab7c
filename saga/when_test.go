package saga_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// approveOver100 makes the order saga's local step approve conditional:
// it runs for amounts over 100 only.
func approveOver100(spec *saga.Spec[order]) {
	spec.Steps[1].When = func(o order) bool { return o.Amount > 100 }
}

func TestConditionalStepRunsWhenTrueAndIsSkippedWhenFalse(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, approveOver100)
	for _, c := range []struct {
		id      string
		amount  int
		effects []string
	}{
		{"big", 500, []string{"approve:do"}},
		{"small", 50, nil},
	} {
		start(t, d.testBundle, def, c.id, c.amount)
		d.reply(c.id, d.last(c.id), core.OutcomeSuccess) // credit
		if got := d.last(c.id); got.Step != "stock" {
			t.Fatalf("%s: after credit, command %+v, want stock's", c.id, got)
		}
		d.reply(c.id, d.last(c.id), core.OutcomeSuccess)
		in := d.get(c.id)
		if in.Status != saga.StatusCompleted {
			t.Fatalf("%s: %s (%s)", c.id, in.Status, in.LastError)
		}
		if got := d.effects(c.id); !slices.Equal(got, c.effects) {
			t.Fatalf("%s: effects %v, want %v", c.id, got, c.effects)
		}
		wantApprove := saga.StepDone
		if c.amount <= 100 {
			wantApprove = saga.StepSkipped
		}
		if st := in.Steps["approve"]; st == nil || st.Status != wantApprove {
			t.Fatalf("%s: approve is %+v, want %s", c.id, st, wantApprove)
		}
	}
	// The skip is in the history, said to be by condition.
	var skipped []saga.HistoryEntry
	for _, h := range historyOf(t, d.o, "small") {
		if h.Event == "skipped" {
			skipped = append(skipped, h)
		}
	}
	if len(skipped) != 1 || skipped[0].Step != "approve" || skipped[0].Outcome != "condition" || skipped[0].Actor != "" {
		t.Fatalf("skipped lines %+v, want one for approve, outcome condition", skipped)
	}
	if h := events(t, d.testBundle, "big"); slices.Contains(h, "skipped:approve") {
		t.Fatalf("big order's history %v has a skip", h)
	}
}

func TestCompensationPassesOverAStepSkippedByCondition(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, approveOver100)
	start(t, d.testBundle, def, "o", 50)
	d.reply("o", d.last("o"), core.OutcomeSuccess) // credit
	d.reply("o", d.last("o"), core.OutcomeFailure) // stock refuses: compensate
	d.reply("o", d.last("o"), core.OutcomeSuccess) // credit's compensation
	in := d.get("o")
	if in.Status != saga.StatusCompensated {
		t.Fatalf("%s (%s), want compensated", in.Status, in.LastError)
	}
	var comps []string
	for _, c := range d.commands("o") {
		if c.Op == core.OperationCompensation {
			comps = append(comps, c.Step)
		}
	}
	if !slices.Equal(comps, []string{"credit"}) {
		t.Fatalf("compensations sent %v, want credit's only", comps)
	}
	if got := d.effects("o"); len(got) != 0 {
		t.Fatalf("effects %v: the skipped local step ran or was undone", got)
	}
	if st := in.Steps["approve"]; st.Status != saga.StepSkipped {
		t.Fatalf("approve %+v, want still skipped", st)
	}
}

func TestConditionThatPanicsParksTheSagaAndRetryEvaluatesItAgain(t *testing.T) {
	t.Parallel()
	broken := true
	d, def := orderDriver(t, func(spec *saga.Spec[order]) {
		spec.Steps[1].When = func(o order) bool {
			if broken {
				panic("no condition today")
			}
			return false
		}
	})
	start(t, d.testBundle, def, "o", 50)
	d.reply("o", d.last("o"), core.OutcomeSuccess)
	in := d.get("o")
	if in.Status != saga.StatusStuck || in.Step != "approve" || !strings.Contains(in.LastError, "no condition today") {
		t.Fatalf("%s at %s (%s), want stuck at approve naming the panic", in.Status, in.Step, in.LastError)
	}
	broken = false
	if _, err := d.o.Retry(context.Background(), "o", saga.Actor{Operator: "alice", Reason: "fixed"}); err != nil {
		t.Fatal(err)
	}
	if got := d.last("o"); got.Step != "stock" {
		t.Fatalf("after the retry, command %+v, want stock's", got)
	}
}

func TestDefineRefusesAConditionalPivot(t *testing.T) {
	t.Parallel()
	_, err := saga.Define(saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{
		{Name: "p", Kind: saga.Pivot, Action: &saga.Command[order]{Topic: "t"}, When: func(order) bool { return true }},
	}})
	if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), `pivot step "p" has a condition`) {
		t.Fatalf("got %v, want ErrConfig refusing the conditional pivot", err)
	}
}
