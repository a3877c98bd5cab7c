package saga_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// groupSpec: reserve (remote), then credit and stock in parallel (group
// "pay"), then ship (remote); all compensatable.
func groupSpec() saga.Spec[order] {
	remote := func(name, group string) saga.Step[order] {
		return saga.Step[order]{Name: name, Kind: saga.Compensatable, Group: group, Timeout: time.Second,
			Action: &saga.Command[order]{Topic: name}, Compensation: &saga.Command[order]{}}
	}
	return saga.Spec[order]{Type: "order", Version: 1, Steps: []saga.Step[order]{
		remote("reserve", ""), remote("credit", "pay"), remote("stock", "pay"), remote("ship", ""),
	}}
}

func groupDriver(t *testing.T) (*driver, *saga.Definition[order]) {
	t.Helper()
	var def *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		def = mustDefine(t, groupSpec())
		return []saga.Registrable{def}
	})
	return d, def
}

// find returns the saga's latest command for step and operation.
func (d *driver) find(id, step, op string) cmd {
	d.t.Helper()
	cs := d.commands(id)
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].Step == step && cs[i].Op == op {
			return cs[i]
		}
	}
	d.t.Fatalf("saga %s sent no %s command for %s", id, op, step)
	return cmd{}
}

func steps(cs []cmd) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Step+":"+c.Op)
	}
	return out
}

func TestParallelGroupRunsTogether(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	id := "g-ok"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess) // reserve
	if got := steps(d.commands(id)); !slices.Equal(got, []string{"reserve:action", "credit:action", "stock:action"}) {
		t.Fatalf("commands %v", got)
	}
	if in := d.get(id); in.Step != "pay" {
		t.Fatalf("current step %q, want the group", in.Step)
	}
	d.reply(id, d.find(id, "stock", "action"), core.OutcomeSuccess)
	if c := d.last(id); c.Step != "stock" {
		t.Fatalf("moved on before the whole group finished: %+v", c)
	}
	d.reply(id, d.find(id, "credit", "action"), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeSuccess) // ship
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
}

// A member fails while the other is in flight: nothing is compensated
// until the other finishes; then it, and the steps before, are compensated
// in reverse order; the failed member is not.
func TestParallelGroupMemberFails(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	id := "g-fail"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.find(id, "credit", "action"), core.OutcomeFailure)
	if in := d.get(id); in.Status != saga.StatusRunning || len(d.commands(id)) != 3 {
		t.Fatalf("did not wait for the member in flight: %s %v", in.Status, steps(d.commands(id)))
	}
	d.reply(id, d.find(id, "stock", "action"), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	got := steps(d.commands(id))
	want := []string{"reserve:action", "credit:action", "stock:action", "stock:compensation", "reserve:compensation"}
	if !slices.Equal(got, want) {
		t.Fatalf("commands\n got %v\nwant %v", got, want)
	}
	if in := d.get(id); in.Status != saga.StatusCompensated || !strings.Contains(in.LastError, "step credit failed") {
		t.Fatalf("%s %q", in.Status, in.LastError)
	}
}

// Once a member failed, a member that times out is not retried: it may
// have taken effect, so it is compensated.
func TestParallelGroupNoRetryOnceFailing(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	id := "g-timeout"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.find(id, "stock", "action"), core.OutcomeFailure)
	d.tick(time.Second) // credit times out
	if c := d.last(id); c.Step != "credit" || c.Op != "compensation" {
		t.Fatalf("after the timeout: %+v (%v)", c, steps(d.commands(id)))
	}
	d.reply(id, d.last(id), core.OutcomeSuccess)
	if c := d.last(id); c.Step != "reserve" || c.Op != "compensation" {
		t.Fatalf("then %+v", c)
	}
}

// Without a failure, a member's timeout retries it alone.
func TestParallelGroupMemberRetriedAlone(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	id := "g-retry"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.reply(id, d.find(id, "credit", "action"), core.OutcomeSuccess)
	d.tick(time.Second) // stock times out: it backs off
	if n := len(d.commands(id)); n != 3 {
		t.Fatalf("retried at once: %v", steps(d.commands(id)))
	}
	d.tick(time.Second) // the backoff
	c := d.last(id)
	if c.Step != "stock" || c.Attempt != 2 || len(d.commands(id)) != 4 {
		t.Fatalf("retry %+v %v", c, steps(d.commands(id)))
	}
	d.reply(id, c, core.OutcomeSuccess)
	if c := d.last(id); c.Step != "ship" {
		t.Fatalf("then %+v", c)
	}
}

func TestParallelGroupOperatorActions(t *testing.T) {
	t.Parallel()
	d, def := groupDriver(t)
	ctx := context.Background()
	start(t, d.testBundle, def, "g-abort", 1)
	d.reply("g-abort", d.last("g-abort"), core.OutcomeSuccess)
	in, err := d.o.Abort(ctx, "g-abort", operator)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompensating || d.last("g-abort").Step != "stock" || d.last("g-abort").Op != "compensation" {
		t.Fatalf("abort: %s %v", in.Status, steps(d.commands("g-abort")))
	}
	start(t, d.testBundle, def, "g-skip", 1)
	d.reply("g-skip", d.last("g-skip"), core.OutcomeSuccess)
	d.reply("g-skip", d.find("g-skip", "credit", "action"), core.OutcomeSuccess)
	if _, err := d.o.MarkCompensated(ctx, "g-skip", operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("mark-compensated on a running group: %v", err)
	}
	if _, err := d.o.Skip(ctx, "g-skip", operator); err != nil {
		t.Fatal(err)
	}
	if in := d.get("g-skip"); in.Steps["stock"].Status != saga.StepSkipped || in.Steps["credit"].Status != saga.StepDone || d.last("g-skip").Step != "ship" {
		t.Fatalf("skip: %+v %+v %v", in.Steps["credit"], in.Steps["stock"], steps(d.commands("g-skip")))
	}
}

func TestDefineRefusesInvalidGroups(t *testing.T) {
	t.Parallel()
	base := groupSpec()
	with := func(f func(s *saga.Spec[order])) saga.Spec[order] {
		s := base
		s.Steps = slices.Clone(base.Steps)
		f(&s)
		return s
	}
	cases := map[string]saga.Spec[order]{
		"split":      with(func(s *saga.Spec[order]) { s.Steps[2].Group, s.Steps[3].Group = "", "pay" }),
		"name clash": with(func(s *saga.Spec[order]) { s.Steps[1].Group, s.Steps[2].Group = "ship", "ship" }),
		"pivot in a group": with(func(s *saga.Spec[order]) {
			s.Steps[2] = saga.Step[order]{Name: "stock", Kind: saga.Pivot, Group: "pay", Action: &saga.Command[order]{Topic: "t"}}
			s.Steps[3] = saga.Step[order]{Name: "ship", Kind: saga.Retriable, Action: &saga.Command[order]{Topic: "t"}, Retry: saga.RetryPolicy{MaxAttempts: 2}}
		}),
	}
	for name, spec := range cases {
		if _, err := saga.Define(spec); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
