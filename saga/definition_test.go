package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

func TestDefineRefusesInvalidDefinitions(t *testing.T) {
	t.Parallel()
	remote := func(name string, kind saga.Kind) saga.Step[order] {
		return saga.Step[order]{Name: name, Kind: kind, Action: &saga.Command[order]{Topic: "t"}}
	}
	compensated := func(name string) saga.Step[order] {
		s := remote(name, saga.Compensatable)
		s.Compensation = &saga.Command[order]{Topic: "t"}
		return s
	}
	local := func(ctx context.Context, tx pgx.Tx, o *order) error { return nil }
	retry := saga.RetryPolicy{MaxAttempts: 5}
	retriable := func(name string) saga.Step[order] {
		s := remote(name, saga.Retriable)
		s.Retry = retry
		return s
	}
	with := func(s saga.Step[order], f func(*saga.Step[order])) saga.Step[order] { f(&s); return s }
	cases := []struct {
		name  string
		spec  saga.Spec[order]
		wants string
	}{
		{"no type", saga.Spec[order]{Version: 1, Steps: []saga.Step[order]{compensated("a")}}, "type: empty"},
		{"version 0", saga.Spec[order]{Type: "x", Steps: []saga.Step[order]{compensated("a")}}, "Version must be at least 1"},
		{"no steps", saga.Spec[order]{Type: "x", Version: 1}, "no steps"},
		{"duplicate names", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{compensated("a"), compensated("a")}}, `two steps are named "a"`},
		{"empty name", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{compensated("")}}, "name: empty"},
		{"NUL in name", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{compensated("a\x00")}}, "contains NUL"},
		{"no command", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{{Name: "a", Kind: saga.Compensatable}}}, `step "a" has no command`},
		{"remote and local", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{with(compensated("a"), func(s *saga.Step[order]) { s.Local = local })}}, "both Action and Local"},
		{"no topic", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{{Name: "a", Kind: saga.Compensatable, Action: &saga.Command[order]{}}}}, "Action.Topic is required"},
		{"no kind", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("a", 0)}}, "Kind is required"},
		{"compensatable after pivot", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("p", saga.Pivot), compensated("a")}}, `compensatable step "a" comes after the pivot "p"`},
		{"two pivots", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("p", saga.Pivot), remote("q", saga.Pivot)}}, "second pivot"},
		{"compensated pivot", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{with(remote("p", saga.Pivot), func(s *saga.Step[order]) { s.Compensation = &saga.Command[order]{Topic: "t"} })}}, "pivot step \"p\" has a compensation"},
		{"retriable before pivot", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{retriable("r"), remote("p", saga.Pivot)}}, "comes before any pivot"},
		{"retriable without retry policy", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("p", saga.Pivot), remote("r", saga.Retriable)}}, "no retry policy"},
		{"compensated retriable", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("p", saga.Pivot), with(retriable("r"), func(s *saga.Step[order]) { s.Compensation = &saga.Command[order]{Topic: "t"} })}}, "never compensated"},
		{"retriable that compensates on timeout", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{remote("p", saga.Pivot), with(retriable("r"), func(s *saga.Step[order]) { s.OnTimeout = saga.TimeoutCompensate })}}, "never compensate"},
		{"local step with remote compensation", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{{Name: "a", Kind: saga.Compensatable, Local: local, Compensation: &saga.Command[order]{Topic: "t"}}}}, "use LocalCompensation"},
		{"remote step with local compensation", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{with(remote("a", saga.Compensatable), func(s *saga.Step[order]) { s.LocalCompensation = local })}}, "use Compensation"},
		{"negative timeout", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{with(compensated("a"), func(s *saga.Step[order]) { s.Timeout = -time.Second })}}, "negative Timeout"},
	}
	for _, c := range cases {
		_, err := saga.Define(c.spec)
		if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: got %v, want ErrConfig with %q", c.name, err, c.wants)
		}
	}
	// And a valid one with every kind.
	if _, err := saga.Define(saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{
		compensated("a"), {Name: "b", Kind: saga.Compensatable, Local: local, LocalCompensation: local},
		remote("p", saga.Pivot), retriable("r"),
	}}); err != nil {
		t.Fatal(err)
	}
}

func TestRegisterRefusesAnotherDefinitionOfTheSameVersion(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	if err := d.o.Register(def); err != nil {
		t.Fatalf("registering the same definition again: %v", err)
	}
	other := mustDefine(t, orderSpec(d.testBundle, 1))
	if err := d.o.Register(other); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("another v1: %v", err)
	}
}

// shipSpec has a pivot (a local "charge") and a retriable remote "ship".
func shipSpec(version int) saga.Spec[order] {
	return saga.Spec[order]{Type: "order", Version: version, Steps: []saga.Step[order]{
		{Name: "credit", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "credit"}, Compensation: &saga.Command[order]{Topic: "credit"}, Timeout: time.Second},
		{Name: "charge", Kind: saga.Pivot, Local: func(ctx context.Context, tx pgx.Tx, o *order) error { return nil }},
		{Name: "ship", Kind: saga.Retriable, Action: &saga.Command[order]{Topic: "ship"}, Timeout: time.Second,
			Retry: saga.RetryPolicy{MaxAttempts: 3, MinBackoff: time.Second}},
	}}
}

func TestAfterThePivotRetryForwardNeverCompensate(t *testing.T) {
	t.Parallel()
	var def *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		def = mustDefine(t, shipSpec(1))
		return []saga.Registrable{def}
	})
	id := "o-ship"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	// ship fails (retried: it is retriable), times out, fails again: stuck.
	d.reply(id, d.last(id), core.OutcomeFailure)
	d.tick(time.Second)
	if c := d.last(id); c.Step != "ship" || c.Attempt != 2 {
		t.Fatalf("retry %+v", c)
	}
	d.tick(time.Second)     // timeout of attempt 2
	d.tick(2 * time.Second) // its backoff (the second try's)
	if c := d.last(id); c.Attempt != 3 {
		t.Fatalf("retry after timeout %+v", c)
	}
	d.reply(id, d.last(id), core.OutcomeFailure)
	in := d.get(id)
	if in.Status != saga.StatusStuck || in.Phase != saga.PhaseForward {
		t.Fatalf("saga %s phase %s", in.Status, in.Phase)
	}
	for _, c := range d.commands(id) {
		if c.Op == "compensation" {
			t.Fatalf("compensated after the pivot: %+v", c)
		}
	}
	if _, err := d.o.Abort(context.Background(), id, operator); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Fatalf("abort after the pivot: %v", err)
	}
	if _, err := d.o.Retry(context.Background(), id, operator); err != nil {
		t.Fatal(err)
	}
	c := d.last(id)
	if c.Attempt != 4 {
		t.Fatalf("operator retry %+v", c)
	}
	d.reply(id, c, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
}

func TestOldVersionFinishesOnItsOwnVersion(t *testing.T) {
	t.Parallel()
	var v1, v2 *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		v1 = mustDefine(t, orderSpec(b, 1))
		return []saga.Registrable{v1}
	})
	start(t, d.testBundle, v1, "o-v1", 1)
	// A deploy registers v2 (a new first step) next to v1.
	v2spec := orderSpec(d.testBundle, 2)
	v2spec.Steps = append([]saga.Step[order]{{Name: "fraud-check", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "fraud"}}}, v2spec.Steps...)
	v2 = mustDefine(t, v2spec)
	if err := d.o.Register(v2); err != nil {
		t.Fatal(err)
	}
	start(t, d.testBundle, v2, "o-v2", 1)
	if c := d.last("o-v2"); c.Step != "fraud-check" {
		t.Fatalf("v2 starts with %+v", c)
	}
	d.reply("o-v1", d.last("o-v1"), core.OutcomeSuccess)
	if c := d.last("o-v1"); c.Step != "stock" {
		t.Fatalf("v1 went on with %+v", c)
	}
	d.reply("o-v1", d.last("o-v1"), core.OutcomeSuccess)
	if in := d.get("o-v1"); in.Status != saga.StatusCompleted || in.Version != 1 || in.Steps["fraud-check"] != nil {
		t.Fatalf("v1 saga: %s v%d %+v", in.Status, in.Version, in.Steps)
	}
}

func TestUnregisteredVersionIsParkedAsStuck(t *testing.T) {
	t.Parallel()
	var v1 *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		v1 = mustDefine(t, orderSpec(b, 1))
		return []saga.Registrable{v1}
	})
	start(t, d.testBundle, v1, "o-a", 1)
	start(t, d.testBundle, v1, "o-b", 1)
	// A new orchestrator knows only v2.
	metrics := prometheus.NewPedanticRegistry()
	o2, err := saga.New(d.db.Pool, saga.Config{Schema: d.db.Schema, Clock: d.clock, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	v2spec := orderSpec(d.testBundle, 2)
	if err := o2.Register(mustDefine(t, v2spec)); err != nil {
		t.Fatal(err)
	}
	// A reply reaches it: the saga is parked, the reply kept in history.
	if err := o2.Handler()(replyMsg("o-a", d.last("o-a"), core.OutcomeSuccess, "", "")); err != nil {
		t.Fatal(err)
	}
	in := d.get("o-a")
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "order v1 is not registered") {
		t.Fatalf("o-a: %s %q", in.Status, in.LastError)
	}
	// At start, the others are found and parked too.
	n, err := o2.ParkUnregistered(context.Background())
	if err != nil || n != 1 {
		t.Fatalf("parked %d, %v", n, err)
	}
	if in := d.get("o-b"); in.Status != saga.StatusStuck {
		t.Fatalf("o-b: %s", in.Status)
	}
	if got := counterValue(t, metrics, "millrace_saga_unregistered_total"); got != 2 {
		t.Fatalf("unregistered metric %v", got)
	}
	if _, err := o2.Retry(context.Background(), "o-b", operator); !errors.Is(err, saga.ErrNotRegistered) {
		t.Fatalf("retry on an unregistered version: %v", err)
	}
	// Registering v1 again lets an operator resume it.
	if err := o2.Register(v1); err != nil {
		t.Fatal(err)
	}
	if in, err := o2.Retry(context.Background(), "o-b", operator); err != nil || in.Status != saga.StatusRunning {
		t.Fatalf("retry once v1 is back: %v", err)
	}
}

// A local step that panics fails like any error (the saga compensates,
// the reason says so); the orchestrator does not crash.
func TestPanickingLocalStepFails(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[1].Local = func(ctx context.Context, tx pgx.Tx, o *order) error { panic("boom") }
		s.Steps[1].Retry = saga.RetryPolicy{MaxAttempts: 1}
	})
	id := "o-panic"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	in := d.get(id)
	if in.Status != saga.StatusCompensating || !strings.Contains(in.LastError, "panic") || !strings.Contains(in.LastError, "boom") {
		t.Fatalf("%s %q", in.Status, in.LastError)
	}
}

// Steps that set no policy take Spec.Defaults: here a 5s timeout and two
// attempts 2s apart (the built-in defaults are 30s and three, 1s apart),
// and a retriable step needs no Retry of its own.
func TestStepsInheritSpecDefaults(t *testing.T) {
	t.Parallel()
	var def *saga.Definition[order]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		def = mustDefine(t, saga.Spec[order]{Type: "order", Version: 1,
			Defaults: saga.StepDefaults{Timeout: 5 * time.Second, Retry: saga.RetryPolicy{MaxAttempts: 2, MinBackoff: 2 * time.Second}},
			Steps: []saga.Step[order]{
				{Name: "credit", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: "credit"}, Compensation: &saga.Command[order]{}},
				{Name: "charge", Kind: saga.Pivot, Local: func(ctx context.Context, tx pgx.Tx, o *order) error { return nil }},
				{Name: "ship", Kind: saga.Retriable, Action: &saga.Command[order]{Topic: "ship"}},
			}})
		return []saga.Registrable{def}
	})
	id := "o-defaults"
	start(t, d.testBundle, def, id, 1)
	d.tick(5 * time.Second) // the inherited timeout of attempt 1
	d.tick(time.Second)
	if c := d.last(id); c.Attempt != 1 {
		t.Fatalf("attempt 2 after 1s of backoff: %+v, want the inherited 2s", c)
	}
	d.tick(time.Second)
	if c := d.last(id); c.Step != "credit" || c.Attempt != 2 || c.Op != "action" {
		t.Fatalf("after the backoff: %+v, want credit's action, attempt 2", c)
	}
	d.tick(5 * time.Second) // attempt 2 times out: the inherited two attempts are spent
	if c := d.last(id); c.Op != "compensation" {
		t.Fatalf("after two attempts: %+v, want credit's compensation", c)
	}
}
