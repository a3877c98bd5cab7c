package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/saga"
)

// trip is the parent saga's data; parcel its shipping child's.
type trip struct {
	ID       string `json:"id"`
	Tracking string `json:"tracking,omitempty"`
}

type parcel struct {
	Order    string `json:"order"`
	Tracking string `json:"tracking,omitempty"`
}

// shippingSpec is a two-step child saga: pack and send, both remote and
// compensatable; send's reply gives the tracking number.
func shippingSpec(tweak func(*saga.Step[parcel])) saga.Spec[parcel] {
	spec := saga.Spec[parcel]{Type: "shipping", Version: 1, Steps: []saga.Step[parcel]{
		{Name: "pack", Kind: saga.Compensatable, Timeout: time.Second,
			Action: &saga.Command[parcel]{Topic: "pack"}, Compensation: &saga.Command[parcel]{}},
		{Name: "send", Kind: saga.Compensatable, Timeout: time.Second,
			Action: &saga.Command[parcel]{Topic: "send"}, Compensation: &saga.Command[parcel]{},
			OnSuccess: saga.Reply(func(p *parcel, r struct {
				Tracking string `json:"tracking"`
			}) error {
				p.Tracking = r.Tracking
				return nil
			})},
	}}
	if tweak != nil {
		tweak(&spec.Steps[0])
	}
	return spec
}

// tripSpec is the parent: credit (remote), shipping (the child saga),
// invoice (remote), all compensatable.
func tripSpec(t testing.TB, child *saga.Definition[parcel]) saga.Spec[trip] {
	return saga.Spec[trip]{Type: "trip", Version: 1, Steps: []saga.Step[trip]{
		{Name: "credit", Kind: saga.Compensatable, Timeout: time.Second,
			Action: &saga.Command[trip]{Topic: "credit"}, Compensation: &saga.Command[trip]{}},
		{Name: "shipping", Kind: saga.Compensatable, Child: &saga.Child[trip]{
			Definition: child,
			Data:       func(tr trip) (any, error) { return parcel{Order: tr.ID}, nil },
			OnDone: func(tr *trip, raw json.RawMessage) error {
				var p parcel
				if err := json.Unmarshal(raw, &p); err != nil {
					return err
				}
				tr.Tracking = p.Tracking
				return nil
			},
		}},
		{Name: "invoice", Kind: saga.Compensatable, Timeout: time.Second,
			Action: &saga.Command[trip]{Topic: "invoice"}, Compensation: &saga.Command[trip]{}},
	}}
}

// childDriver is a driver whose parent definition is the trip saga with
// a shipping child (tweaked), and whose hook crashes (returns an error) at
// crash's point for a saga while crash is armed.
type childDriver struct {
	*driver
	def   *saga.Definition[trip]
	child *saga.Definition[parcel]

	mu    sync.Mutex
	crash func(p sagahook.Point, id string) bool
}

func setupChildDriver(t *testing.T, tweak func(*saga.Step[parcel])) *childDriver {
	t.Helper()
	cd := &childDriver{}
	clock := newManualClock()
	hook := func(_ context.Context, p sagahook.Point, id string) error {
		cd.mu.Lock()
		defer cd.mu.Unlock()
		if cd.crash != nil && cd.crash(p, id) {
			return errors.New("crash")
		}
		return nil
	}
	b := setup(t, bundleOptions{clock: clock, hook: hook})
	cd.child = mustDefine(t, shippingSpec(tweak))
	cd.def = mustDefine(t, tripSpec(t, cd.child))
	if err := b.o.Register(cd.def); err != nil { // registers the child's definition too
		t.Fatal(err)
	}
	cd.driver = &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
	return cd
}

func (d *childDriver) arm(crash func(p sagahook.Point, id string) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.crash = crash
}

// answer replies to saga id's last command, as its participant would.
func (d *childDriver) answer(id, outcome, payload string) error {
	d.t.Helper()
	in := d.get(id)
	msg := replyMsg(id, d.last(id), outcome, "because", payload)
	msg.Metadata[core.MetadataSagaType] = in.Type
	msg.UUID = watermill.NewUUID()
	return d.handler(msg)
}

func (d *childDriver) ok(id string) {
	d.t.Helper()
	if err := d.answer(id, core.OutcomeSuccess, `{"tracking":"T-1"}`); err != nil {
		d.t.Fatal(err)
	}
}

func (d *childDriver) fail(id string) {
	d.t.Helper()
	if err := d.answer(id, core.OutcomeFailure, ""); err != nil {
		d.t.Fatal(err)
	}
}

func (d *childDriver) want(id string, status saga.Status, step string) *saga.Instance {
	d.t.Helper()
	in := d.get(id)
	if in.Status != status || in.Step != step {
		d.t.Fatalf("saga %s is %s at %q (%s), want %s at %q", id, in.Status, in.Step, in.LastError, status, step)
	}
	return in
}

func (d *childDriver) children(id string) []*saga.Instance {
	d.t.Helper()
	res, err := d.o.List(context.Background(), saga.ListParams{Parent: id})
	if err != nil {
		d.t.Fatal(err)
	}
	return res.Sagas
}

const child1 = "p/shipping/1"

func TestChildSagaCompletesAndTheParentMovesOn(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p") // credit: the parent starts its child in the same transaction
	d.want("p", saga.StatusRunning, "shipping")
	c := d.want(child1, saga.StatusRunning, "pack")
	var in parcel
	if err := json.Unmarshal(c.Input, &in); err != nil || c.Parent != "p" || c.Type != "shipping" || in.Order != "p" {
		t.Fatalf("child %+v", c)
	}
	if kids := d.children("p"); len(kids) != 1 || kids[0].ID != child1 {
		t.Fatalf("children of p: %v", kids)
	}
	d.ok(child1) // pack
	d.ok(child1) // send
	d.want(child1, saga.StatusCompleted, "")
	d.want("p", saga.StatusRunning, "shipping") // told, not yet applied
	d.tick(0)                                   // the timer pass applies the child's end
	p := d.want("p", saga.StatusRunning, "invoice")
	if got := dataOfTrip(t, p); got.Tracking != "T-1" {
		t.Fatalf("parent data %s: OnDone not applied", p.Data)
	}
	d.ok("p")
	d.want("p", saga.StatusCompleted, "")
	h := events(t, d.testBundle, "p")
	for _, want := range []string{"child:shipping", "child_completed:shipping", "step_done:shipping"} {
		if !containsStr(h, want) {
			t.Fatalf("parent history %v lacks %s", h, want)
		}
	}
}

func TestChildSagaCompensatedFailsTheStepAndTheParentCompensates(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.fail(child1) // pack refuses: the child compensates (nothing took effect)
	d.want(child1, saga.StatusCompensated, "")
	d.tick(0)
	in := d.want("p", saga.StatusCompensating, "credit")
	if !strings.Contains(in.LastError, "child saga "+child1+" compensated") {
		t.Fatalf("parent's reason %q does not name the child", in.LastError)
	}
	if c := d.last("p"); c.Step != "credit" || c.Op != core.OperationCompensation {
		t.Fatalf("last command %+v, want credit's compensation", c)
	}
	d.ok("p")
	d.want("p", saga.StatusCompensated, "")
	if st := d.get("p").Steps["shipping"]; st.Status != saga.StepFailed {
		t.Fatalf("shipping step %+v, want failed (its child undid itself)", st)
	}
	if kids := d.children("p"); len(kids) != 1 {
		t.Fatalf("%d children, want 1", len(kids))
	}
}

func TestChildSagaStuckParksTheParentNamingTheChild(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, func(s *saga.Step[parcel]) { s.OnTimeout = saga.TimeoutStuck })
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.tick(2 * time.Second) // pack times out: the child is stuck, and tells its parent
	d.want(child1, saga.StatusStuck, "pack")
	in := d.want("p", saga.StatusStuck, "shipping")
	if !strings.Contains(in.LastError, "child saga "+child1+" is stuck") {
		t.Fatalf("parent's reason %q does not name the child", in.LastError)
	}
	by := saga.Actor{Operator: "alice", Reason: "look"}
	if _, err := d.o.Retry(context.Background(), "p", by); !errors.Is(err, saga.ErrActionNotAllowed) || !strings.Contains(err.Error(), child1) {
		t.Fatalf("retry of the parent: %v, want ErrActionNotAllowed naming the child", err)
	}
	// The operator retries the child; its end moves the parent on.
	if _, err := d.o.Retry(context.Background(), child1, by); err != nil {
		t.Fatal(err)
	}
	d.ok(child1)
	d.ok(child1)
	d.tick(0)
	d.want("p", saga.StatusRunning, "invoice")
	d.ok("p")
	d.want("p", saga.StatusCompleted, "")
}

func TestCompensatingTheParentCompensatesItsCompletedChild(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.ok(child1)
	d.ok(child1)
	d.tick(0)
	d.fail("p") // invoice refuses: the parent compensates, its child first
	d.want("p", saga.StatusCompensating, "shipping")
	if st := d.get("p").Steps["shipping"]; st.Status != saga.StepCompensating {
		t.Fatalf("shipping %+v, want compensating", st)
	}
	d.tick(0) // the child takes the request: it compensates send, then pack
	d.want(child1, saga.StatusCompensating, "send")
	d.ok(child1)
	d.want(child1, saga.StatusCompensating, "pack")
	d.ok(child1)
	d.want(child1, saga.StatusCompensated, "")
	d.tick(0) // the parent takes the child's end: credit's compensation
	d.want("p", saga.StatusCompensating, "credit")
	d.ok("p")
	in := d.want("p", saga.StatusCompensated, "")
	if st := in.Steps["shipping"]; st.Status != saga.StepCompensated {
		t.Fatalf("shipping %+v, want compensated", st)
	}
	if !strings.Contains(in.LastError, "invoice") {
		t.Fatalf("parent ends with %q, want invoice's failure", in.LastError)
	}
	var comps []string
	for _, c := range d.commands(child1) {
		if c.Op == core.OperationCompensation {
			comps = append(comps, c.Step)
		}
	}
	if fmt.Sprint(comps) != "[send pack]" {
		t.Fatalf("child's compensations %v, want [send pack]", comps)
	}
}

// The parent crashes (its transaction rolls back) as it starts its child,
// and again as it applies the child's end: one child is started, and the
// parent finishes.
func TestParentCrashingBetweenChildStartAndItsEndStartsOneChild(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	credit := replyMsg("p", d.last("p"), core.OutcomeSuccess, "", "")
	credit.Metadata[core.MetadataSagaType] = "trip"
	d.arm(func(p sagahook.Point, id string) bool { return p == sagahook.BeforeCommit && id == "p" })
	if err := d.handler(credit); err == nil {
		t.Fatal("the crash did not fail the reply")
	}
	if kids := d.children("p"); len(kids) != 0 {
		t.Fatalf("a child outlived its parent's rolled back transaction: %v", kids[0].ID)
	}
	d.arm(nil)
	d.deliver(credit) // redelivered
	d.deliver(credit) // and again: a duplicate
	d.ok(child1)
	d.ok(child1)
	d.arm(func(p sagahook.Point, id string) bool { return p == sagahook.BeforeCommit && id == "p" })
	d.clock.Advance(0)
	if _, err := d.o.RunDue(context.Background()); err == nil {
		t.Fatal("the crash did not fail the timer pass")
	}
	d.want("p", saga.StatusRunning, "shipping")
	d.arm(nil)
	d.tick(time.Minute) // after the failed pass's backoff
	d.want("p", saga.StatusRunning, "invoice")
	d.ok("p")
	d.want("p", saga.StatusCompleted, "")
	if kids := d.children("p"); len(kids) != 1 || kids[0].ID != child1 {
		t.Fatalf("children %v, want %s only", kids, child1)
	}
}

func TestDefineRefusesAMalformedChildStep(t *testing.T) {
	t.Parallel()
	child := mustDefine(t, shippingSpec(nil))
	pivoted := mustDefine(t, saga.Spec[parcel]{Type: "pivoted", Version: 1, Steps: []saga.Step[parcel]{
		{Name: "go", Kind: saga.Pivot, Action: &saga.Command[parcel]{Topic: "t"}}}})
	step := func(f func(*saga.Step[trip])) saga.Spec[trip] {
		s := saga.Step[trip]{Name: "c", Kind: saga.Compensatable, Child: &saga.Child[trip]{Definition: child}}
		f(&s)
		return saga.Spec[trip]{Type: "x", Version: 1, Steps: []saga.Step[trip]{s}}
	}
	for want, spec := range map[string]saga.Spec[trip]{
		"Child.Definition is required": step(func(s *saga.Step[trip]) { s.Child.Definition = nil }),
		"has no Action":                step(func(s *saga.Step[trip]) { s.Action = &saga.Command[trip]{Topic: "t"} }),
		"no compensation of its own":   step(func(s *saga.Step[trip]) { s.Compensation = &saga.Command[trip]{Topic: "t"} }),
		"parallel group":               step(func(s *saga.Step[trip]) { s.Group = "g" }),
		"has a pivot":                  step(func(s *saga.Step[trip]) { s.Child.Definition = pivoted }),
	} {
		if _, err := saga.Define(spec); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want ErrConfig with %q", err, want)
		}
	}
	// A pivot child step may have a child with a pivot.
	if _, err := saga.Define(step(func(s *saga.Step[trip]) { s.Kind, s.Child.Definition = saga.Pivot, pivoted })); err != nil {
		t.Fatal(err)
	}
}

func dataOfTrip(t testing.TB, in *saga.Instance) trip {
	t.Helper()
	var tr trip
	if err := json.Unmarshal(in.Data, &tr); err != nil {
		t.Fatal(err)
	}
	return tr
}

func containsStr(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}

var _ = message.NewMessage

// An operator's Abort of the parent while its child runs: the child is
// asked to compensate (its running step's action may have run), then the
// parent compensates on.
func TestAbortingTheParentCompensatesItsRunningChild(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.want(child1, saga.StatusRunning, "pack")
	if _, err := d.o.Abort(context.Background(), "p", saga.Actor{Operator: "alice", Reason: "customer cancelled"}); err != nil {
		t.Fatal(err)
	}
	d.want("p", saga.StatusCompensating, "shipping")
	d.tick(0)
	d.want(child1, saga.StatusCompensating, "pack")
	if c := d.last(child1); c.Step != "pack" || c.Op != core.OperationCompensation {
		t.Fatalf("child's last command %+v, want pack's compensation", c)
	}
	d.ok(child1)
	d.want(child1, saga.StatusCompensated, "")
	d.tick(0)
	d.want("p", saga.StatusCompensating, "credit")
	d.ok("p")
	if in := d.want("p", saga.StatusCompensated, ""); in.LastError != "aborted by an operator" {
		t.Fatalf("parent ends with %q", in.LastError)
	}
}

// A child saga whose start fails (its data cannot be built) parks the
// parent; the operator's Retry starts it at the next attempt.
func TestRetryStartsAChildThatNeverStarted(t *testing.T) {
	t.Parallel()
	var broken atomic.Bool
	broken.Store(true)
	d := setupChildDriver(t, nil)
	spec := tripSpec(t, d.child)
	spec.Type = "trip2"
	spec.Steps[1].Child.Data = func(tr trip) (any, error) {
		if broken.Load() {
			return nil, errors.New("no address")
		}
		return parcel{Order: tr.ID}, nil
	}
	def := mustDefine(t, spec)
	if err := d.o.Register(def); err != nil {
		t.Fatal(err)
	}
	if _, err := saga.Start(context.Background(), d.o, def, "q", trip{ID: "q"}); err != nil {
		t.Fatal(err)
	}
	credit := replyMsg("q", d.last("q"), core.OutcomeSuccess, "", "")
	credit.Metadata[core.MetadataSagaType] = "trip2"
	d.deliver(credit)
	if in := d.want("q", saga.StatusStuck, "shipping"); !strings.Contains(in.LastError, "no address") {
		t.Fatalf("parent's reason %q", in.LastError)
	}
	if kids := d.children("q"); len(kids) != 0 {
		t.Fatalf("children %v", kids)
	}
	broken.Store(false)
	if _, err := d.o.Retry(context.Background(), "q", saga.Actor{Operator: "alice", Reason: "address fixed"}); err != nil {
		t.Fatal(err)
	}
	d.want("q/shipping/2", saga.StatusRunning, "pack")
	d.ok("q/shipping/2")
	d.ok("q/shipping/2")
	d.tick(0)
	d.want("q", saga.StatusRunning, "invoice")
}

// Run applies a child's end at once, not a PollInterval later: the
// transaction that told the parent wakes it.
func TestRunAppliesAChildsEndAtOnce(t *testing.T) {
	t.Parallel()
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock, poll: time.Hour})
	child := mustDefine(t, shippingSpec(nil))
	def := mustDefine(t, tripSpec(t, child))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &childDriver{driver: &driver{testBundle: b, clock: clock, handler: b.o.Handler()}, def: def, child: child}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.o.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if _, err := saga.Start(context.Background(), b.o, def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.ok(child1)
	d.ok(child1)
	deadline := time.Now().Add(10 * time.Second)
	for d.get("p").Step != "invoice" {
		if time.Now().After(deadline) {
			t.Fatalf("the parent did not take its child's end within 10s (PollInterval 1h): %+v", d.get("p"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A child parked as stuck by its failing timer (no machine ran) tells its
// parent too.
func TestChildParkedByItsTimerParksTheParent(t *testing.T) {
	t.Parallel()
	d := setupChildDriver(t, nil)
	if _, err := saga.Start(context.Background(), d.o, d.def, "p", trip{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	d.ok("p")
	d.arm(func(p sagahook.Point, id string) bool { return p == sagahook.Loaded && id == child1 })
	for range 10 { // pack's timeout, then the failing timer's backoffs
		d.clock.Advance(time.Minute)
		_, _ = d.o.RunDue(context.Background())
	}
	d.arm(nil)
	d.tick(0)
	c := d.want(child1, saga.StatusStuck, "pack")
	if !strings.Contains(c.LastError, "its timer failed") {
		t.Fatalf("child's reason %q", c.LastError)
	}
	if in := d.want("p", saga.StatusStuck, "shipping"); !strings.Contains(in.LastError, "child saga "+child1+" is stuck: its timer failed") {
		t.Fatalf("parent's reason %q", in.LastError)
	}
}
