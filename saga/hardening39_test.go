package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/saga"
)

// handleBatch applies msgs with HandleReplies, the batch path the
// service runs (RunBatched), in one transaction.
func (d *driver) handleBatch(msgs ...*message.Message) *saga.BatchResult {
	d.t.Helper()
	res, err := d.o.HandleReplies(context.Background(), msgs)
	if err != nil {
		d.t.Fatal(err)
	}
	if len(res.Poisoned) > 0 {
		d.t.Fatalf("poisoned %v", res.Poisoned)
	}
	return res
}

// A saga that ends through the batch path (HandleReplies, RunBatched's)
// files the events still pending for its wait steps as ignored, as every
// other path that ends a saga does: none stays pending for ever.
func TestBatchEndedSagaClosesPendingEvents(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	for _, id := range []string{"b-10a", "b-10b"} {
		startPayment(t, d, def, id)
		// Early: stored pending, for the wait step ahead.
		d.signal(id, "payment.confirmed", "psp-"+id, confirmation{Ref: id})
		if got := d.eventStates(id); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
			t.Fatalf("%s: events %v", id, got)
		}
	}
	// Both sagas' first steps fail, in one batch: each compensates (nothing
	// took effect) and ends.
	d.handleBatch(replyMsg("b-10a", d.last("b-10a"), core.OutcomeFailure, "out of stock", ""),
		replyMsg("b-10b", d.last("b-10b"), core.OutcomeFailure, "out of stock", ""))
	for _, id := range []string{"b-10a", "b-10b"} {
		if in := d.get(id); in.Status != saga.StatusCompensated {
			t.Fatalf("%s: status %s (%s)", id, in.Status, in.LastError)
		}
		if got := d.eventStates(id); !slices.Equal(got, []string{"payment.confirmed/ignored"}) {
			t.Fatalf("%s ended through HandleReplies: events %v, want the pending one ignored", id, got)
		}
	}
}

// receipt is the data of a saga that keeps a participant's raw answer.
type receipt struct {
	ID  string          `json:"id"`
	Raw json.RawMessage `json:"raw,omitempty"`
}

// receiptDriver: charge (remote; its OnSuccess keeps the reply's "raw"
// as it came, through a json.RawMessage), then ship (remote).
func receiptDriver(t *testing.T) (*driver, *saga.Definition[receipt]) {
	t.Helper()
	var def *saga.Definition[receipt]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		def = mustDefine(t, saga.Spec[receipt]{Type: "order", Version: 1, Steps: []saga.Step[receipt]{
			{Name: "charge", Kind: saga.Compensatable, Action: &saga.Command[receipt]{Topic: "pay"},
				Compensation: &saga.Command[receipt]{Topic: "pay", Name: "refund"}, Timeout: time.Minute,
				OnSuccess: saga.Reply(func(r *receipt, reply struct {
					Raw json.RawMessage `json:"raw"`
				}) error {
					r.Raw = reply.Raw
					return nil
				})},
			{Name: "ship", Kind: saga.Pivot, Action: &saga.Command[receipt]{Topic: "ship"}, Timeout: time.Minute},
		}})
		return []saga.Registrable{def}
	})
	return d, def
}

// unstorable are reply payloads whose "raw" PostgreSQL's jsonb refuses
// although they are JSON.
var unstorable = map[string]string{
	"surrogate": `{"raw":"\ud800"}`,
	"low":       `{"raw":"x\udc00"}`,
	"huge":      `{"raw":1e999999}`,
	"tiny":      `{"raw":1e-20000}`,
}

// A success reply whose data jsonb cannot store (a lone surrogate, a
// number out of numeric's range, carried by a json.RawMessage) parks the
// saga as stuck with the reason, as a \u0000 does: HandleReplies applies
// it without an error (no retry, no dead letter, no timeout later), and
// an operator's Retry sends the step's action again.
func TestUnstorableReplyParksTheSaga(t *testing.T) {
	t.Parallel()
	d, def := receiptDriver(t)
	ctx := context.Background()
	for name, payload := range unstorable {
		id := "unstorable-" + name
		if _, err := saga.Start(ctx, d.o, def, id, receipt{ID: id}); err != nil {
			t.Fatal(err)
		}
		charge := d.last(id)
		d.handleBatch(replyMsg(id, charge, core.OutcomeSuccess, "", payload))
		in := d.get(id)
		if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "jsonb cannot store") || !in.Steps["charge"].Unapplied {
			t.Fatalf("%s: %s at %s (%s), charge %+v", name, in.Status, in.Step, in.LastError, in.Steps["charge"])
		}
		if _, err := d.o.Retry(ctx, id, alice); err != nil {
			t.Fatal(err)
		}
		if c := d.last(id); c.Step != "charge" || c.Attempt != 2 {
			t.Fatalf("%s: after Retry the last command is %+v", name, c)
		}
	}
}

// A reply held while the saga was paused, whose data jsonb cannot store,
// does not block Resume: Resume (and an operator's resume request) parks
// the saga as stuck with the unapplied reply, as the live reply would,
// and the held reply is gone.
func TestResumeWithUnstorableHeldReplyParksTheSaga(t *testing.T) {
	t.Parallel()
	d, def := receiptDriver(t)
	ctx := context.Background()
	for _, how := range []string{"resume", "request"} {
		id := "held-" + how
		if _, err := saga.Start(ctx, d.o, def, id, receipt{ID: id}); err != nil {
			t.Fatal(err)
		}
		charge := d.last(id)
		if _, err := d.o.Pause(ctx, id, alice); err != nil {
			t.Fatal(err)
		}
		d.handleBatch(replyMsg(id, charge, core.OutcomeSuccess, "", unstorable["surrogate"]))
		if n := len(historyEvents(t, d.o, id, "held")); n != 1 {
			t.Fatalf("%s: %d held lines", id, n)
		}
		bob := saga.Actor{Operator: "bob", Reason: "provider back"}
		if how == "resume" {
			if _, err := d.o.Resume(ctx, id, bob); err != nil {
				t.Fatalf("Resume: %v", err)
			}
		} else {
			if _, err := d.o.Request(ctx, id, saga.ActionResume, bob); err != nil {
				t.Fatal(err)
			}
			if _, err := d.o.RunDue(ctx); err != nil {
				t.Fatalf("RunDue: %v", err)
			}
		}
		in := d.get(id)
		if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "jsonb cannot store") || !in.Steps["charge"].Unapplied || in.Request != nil {
			t.Fatalf("%s: %s (%s), charge %+v, request %+v", id, in.Status, in.LastError, in.Steps["charge"], in.Request)
		}
		var held int
		if err := d.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+d.tbl("saga_held_reply")+` WHERE saga_id = $1`, id).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held != 0 {
			t.Fatalf("%s: %d held replies left", id, held)
		}
	}
}

// SignalTx with a payload jsonb cannot hold never breaks the caller's
// transaction: a lone surrogate becomes U+FFFD (as a NUL escape and
// invalid UTF-8 do) and the event applies; a number out of numeric's
// range is refused with ErrInvalidEvent before any statement runs. The
// EventHandler dead-letters such a message at once (core.Permanent).
func TestSignalUnstorablePayload(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	ctx := context.Background()
	startPayment(t, d, def, "sig-6")
	d.reply("sig-6", d.last("sig-6"), core.OutcomeSuccess) // waiting
	tx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The webhook's own write, before the signal.
	if _, err := tx.Exec(ctx, `INSERT INTO `+d.tbl("test_effect")+` (saga_id, step, what) VALUES ('sig-6', 'webhook', 'got')`); err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{`{"ref":1e999999}`, `{"ref":0.5e-16383}`} {
		err := saga.SignalTx(ctx, tx, d.o, "sig-6", "payment.confirmed", fmt.Sprint("bad-", i), json.RawMessage(p))
		if !errors.Is(err, saga.ErrInvalidEvent) {
			t.Fatalf("payload %s: %v, want ErrInvalidEvent", p, err)
		}
	}
	if err := saga.SignalTx(ctx, tx, d.o, "sig-6", "payment.confirmed", "psp-6", json.RawMessage(`{"ref":"a\ud800b"}`)); err != nil {
		t.Fatalf("lone surrogate: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the caller's transaction: %v", err)
	}
	in := d.get("sig-6")
	if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"a\ufffdb"}) {
		t.Fatalf("%s, data %+v", in.Status, p)
	}
	if got := d.effects("sig-6"); !slices.Equal(got, []string{"webhook:got", "ship:do"}) {
		t.Fatalf("effects %v", got)
	}

	startPayment(t, d, def, "sig-6b")
	h := d.o.EventHandler(func(msg *message.Message) (saga.EventTarget, error) {
		return saga.EventTarget{SagaID: "sig-6b", Event: "payment.confirmed"}, nil
	})
	err = h(message.NewMessage(watermill.NewUUID(), []byte(`{"ref":1e999999}`)))
	if !errors.Is(err, saga.ErrInvalidEvent) || !core.IsPermanent(err) {
		t.Fatalf("EventHandler: %v, want a permanent ErrInvalidEvent", err)
	}
}

// flakyOnce returns an OnEvent that fails technically (not a business
// failure) the first time it runs, and records the event afterwards.
func flakyOnce(name string) func(*payment, json.RawMessage) error {
	var failed atomic.Bool
	return func(p *payment, _ json.RawMessage) error {
		if failed.CompareAndSwap(false, true) {
			return errors.New("the ledger is down")
		}
		p.Got = append(p.Got, name)
		return nil
	}
}

func record(name string) func(*payment, json.RawMessage) error {
	return func(p *payment, _ json.RawMessage) error { p.Got = append(p.Got, name); return nil }
}

// A wait whose first stored event cannot be applied (its OnEvent fails
// technically: the saga parks stuck, that event kept) keeps the other
// stored events it still needs pending, never ignored: after an
// operator's Retry an all-of wait applies both and completes, and a
// one-of-several wait still has its alternatives.
func TestAwaitStuckOnOneEventKeepsTheOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("all", func(t *testing.T) {
		t.Parallel()
		d, def := setupAwait(t, saga.Await[payment]{All: []string{"signed", "verified"},
			On: map[string]func(*payment, json.RawMessage) error{"signed": flakyOnce("signed"), "verified": record("verified")}}, bundleOptions{})
		startPayment(t, d, def, "all-stuck")
		d.signal("all-stuck", "signed", "s", nil)
		d.signal("all-stuck", "verified", "v", nil)
		d.reply("all-stuck", d.last("all-stuck"), core.OutcomeSuccess) // enters the wait: signed fails
		if in := d.get("all-stuck"); in.Status != saga.StatusStuck || in.Step != "paid" {
			t.Fatalf("%s at %s (%s)", in.Status, in.Step, in.LastError)
		}
		if got := d.eventStates("all-stuck"); !slices.Equal(got, []string{"signed/pending", "verified/pending"}) {
			t.Fatalf("while stuck: events %v, want both pending", got)
		}
		if _, err := d.o.Retry(ctx, "all-stuck", alice); err != nil {
			t.Fatal(err)
		}
		in := d.get("all-stuck")
		if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"signed", "verified"}) {
			t.Fatalf("after Retry: %s at %s, data %+v, events %v", in.Status, in.Step, p, d.eventStates("all-stuck"))
		}
	})
	t.Run("any", func(t *testing.T) {
		t.Parallel()
		d, def := setupAwait(t, saga.Await[payment]{Any: []string{"approved", "rejected"},
			On: map[string]func(*payment, json.RawMessage) error{"approved": flakyOnce("approved"), "rejected": record("rejected")}}, bundleOptions{})
		startPayment(t, d, def, "any-stuck")
		d.signal("any-stuck", "approved", "a", nil)
		d.signal("any-stuck", "rejected", "r", nil)
		d.reply("any-stuck", d.last("any-stuck"), core.OutcomeSuccess)
		if in := d.get("any-stuck"); in.Status != saga.StatusStuck {
			t.Fatalf("%s at %s", in.Status, in.Step)
		}
		if got := d.eventStates("any-stuck"); !slices.Equal(got, []string{"approved/pending", "rejected/pending"}) {
			t.Fatalf("while stuck: events %v, want both pending", got)
		}
		if _, err := d.o.Retry(ctx, "any-stuck", alice); err != nil {
			t.Fatal(err)
		}
		in := d.get("any-stuck")
		if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"approved"}) {
			t.Fatalf("after Retry: %s, data %+v", in.Status, p)
		}
		if got := d.eventStates("any-stuck"); !slices.Equal(got, []string{"approved/consumed", "rejected/ignored"}) {
			t.Fatalf("after Retry: events %v", got)
		}
	})
}

// An all-of wait that has applied some of its events has taken effect:
// when the saga compensates from it (an operator's Abort, its timeout's
// TimeoutCompensate, the saga's deadline, a business failure of a later
// event), its LocalCompensation runs.
func TestAwaitAllOfPartlyAppliedIsCompensated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, end := range []string{"abort", "timeout", "deadline", "failure"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			b := setup(t, bundleOptions{clock: clock})
			spec := paymentSpec(b, saga.Await[payment]{All: []string{"signed", "verified"}, On: map[string]func(*payment, json.RawMessage) error{
				"signed":   record("signed"),
				"verified": func(*payment, json.RawMessage) error { return saga.Fail("forged") },
			}, Timeout: time.Hour, OnTimeout: saga.TimeoutCompensate})
			spec.Deadline = 2 * time.Hour
			if end == "deadline" {
				spec.Steps[1].Await.Timeout, spec.Steps[1].Await.OnTimeout = 0, saga.TimeoutRetry
			}
			spec.Steps[1].LocalCompensation = func(ctx context.Context, tx pgx.Tx, p *payment) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+b.tbl("test_effect")+` (saga_id, step, what) VALUES ($1, 'paid', 'undo '||$2)`, p.ID, strings.Join(p.Got, ","))
				return err
			}
			def := mustDefine(t, spec)
			if err := b.o.Register(def); err != nil {
				t.Fatal(err)
			}
			d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
			id := "partly-" + end
			startPayment(t, d, def, id)
			d.reply(id, d.last(id), core.OutcomeSuccess)
			d.signal(id, "signed", "s", nil)
			switch end {
			case "abort":
				if _, err := d.o.Abort(ctx, id, alice); err != nil {
					t.Fatal(err)
				}
			case "timeout":
				d.tick(time.Hour)
			case "deadline":
				d.tick(2 * time.Hour)
			case "failure":
				d.signal(id, "verified", "v", nil)
			}
			if in := d.get(id); in.Status != saga.StatusCompensating {
				t.Fatalf("%s at %s (%s)", in.Status, in.Step, in.LastError)
			}
			if got := d.effects(id); !slices.Equal(got, []string{"paid:undo signed"}) {
				t.Fatalf("effects %v: the wait's LocalCompensation did not run", got)
			}
			if c := d.last(id); c.Step != "reserve" || c.Op != core.OperationCompensation {
				t.Fatalf("last command %+v", c)
			}
		})
	}
}

// An event that arrives after its wait's timeout (or the saga's
// deadline), before a timer pass fired it, does not win over it: the
// signaller fires what is due first, and the event is filed as the timer
// would have left it (ignored after TimeoutCompensate, kept pending for a
// stuck wait). Late events never beat timeouts when the timer loop is
// down.
func TestAwaitEventAfterTheTimeoutLoses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		action   saga.TimeoutAction
		deadline bool
		status   saga.Status
		event    string
	}{
		{"compensate", saga.TimeoutCompensate, false, saga.StatusCompensating, "payment.confirmed/ignored"},
		{"stuck", saga.TimeoutStuck, false, saga.StatusStuck, "payment.confirmed/pending"},
		{"deadline", saga.TimeoutCompensate, true, saga.StatusCompensating, "payment.confirmed/ignored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			b := setup(t, bundleOptions{clock: clock})
			wait := single
			wait.OnTimeout = tc.action
			spec := paymentSpec(b, wait)
			if tc.deadline {
				spec.Deadline = 10 * time.Minute // before the wait's 15
			}
			def := mustDefine(t, spec)
			if err := b.o.Register(def); err != nil {
				t.Fatal(err)
			}
			d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
			id := "late-" + tc.name
			startPayment(t, d, def, id)
			d.reply(id, d.last(id), core.OutcomeSuccess)
			clock.Advance(16 * time.Minute) // no timer pass runs
			err := saga.Signal(context.Background(), d.o, id, "payment.confirmed", "psp", confirmation{Ref: "late"})
			if err != nil {
				t.Fatal(err)
			}
			in := d.get(id)
			if in.Status != tc.status || len(paymentOf(t, in).Got) != 0 {
				t.Fatalf("%s at %s (%s), data %s: the late event won", in.Status, in.Step, in.LastError, in.Data)
			}
			if got := d.eventStates(id); !slices.Equal(got, []string{tc.event}) {
				t.Fatalf("events %v", got)
			}
			if got := d.effects(id); len(got) != 0 {
				t.Fatalf("effects %v", got)
			}
		})
	}
}

// paymentV2 is paymentSpec at version 2 with its wait step "paid" turned
// into a remote step.
func paymentV2(b *testBundle) saga.Spec[payment] {
	spec := paymentSpec(b, single)
	spec.Version = 2
	spec.Steps[1] = saga.Step[payment]{Name: "paid", Kind: saga.Compensatable, Action: &saga.Command[payment]{Topic: "pay"},
		Compensation: &saga.Command[payment]{}, Timeout: time.Minute}
	return spec
}

// Migrate refuses to move a saga whose current step changes kind (a wait
// step that becomes a remote step): the saga stays on its version, with
// the reason in the error, and its timer fires as before.
func TestMigrateRefusesAChangeOfKind(t *testing.T) {
	t.Parallel()
	var v1, v2 *saga.Definition[payment]
	d := setupDriver(t, func(b *testBundle) []saga.Registrable {
		v1, v2 = mustDefine(t, paymentSpec(b, single)), mustDefine(t, paymentV2(b))
		return []saga.Registrable{v1, v2}
	})
	ctx := context.Background()
	startPayment(t, d, v1, "kind")
	d.reply("kind", d.last("kind"), core.OutcomeSuccess) // waiting at paid
	n, err := saga.Migrate(ctx, d.o, saga.Migration[payment, payment]{From: v1, To: v2, Operator: "alice", Reason: "v2"})
	if n != 0 || !errors.Is(err, saga.ErrCannotMigrate) || !strings.Contains(err.Error(), "wait step") {
		t.Fatalf("moved %d: %v", n, err)
	}
	d.tick(15 * time.Minute) // the wait's timeout
	if in := d.get("kind"); in.Version != 1 || in.Status != saga.StatusCompensating {
		t.Fatalf("v%d %s at %s", in.Version, in.Status, in.Step)
	}
}

// A panic in one saga's timer does not escape the pass: it is recovered,
// that saga is parked as stuck with the panic as its reason (it would
// panic again), and the other sagas' timers fire.
func TestTimerPanicParksTheSaga(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		if armed.Load() && p == sagahook.Loaded && (id == "panics" || id == "request-panics") {
			panic("a bug")
		}
		return nil
	}
	d, def := setupAwait(t, single, bundleOptions{hook: hook})
	for _, id := range []string{"panics", "fine"} {
		startPayment(t, d, def, id)
		d.reply(id, d.last(id), core.OutcomeSuccess)
	}
	armed.Store(true)
	d.clock.Advance(15 * time.Minute)
	n, err := d.o.RunDue(context.Background())
	if err == nil || !strings.Contains(err.Error(), "a bug") || n != 2 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	in := d.get("panics")
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "panicked: a bug") || in.NextWakeupAt != nil {
		t.Fatalf("panics: %s (%s)", in.Status, in.LastError)
	}
	if in := d.get("fine"); in.Status != saga.StatusCompensating {
		t.Fatalf("fine: %s", in.Status)
	}
	// An operator request whose application panics is dropped at once.
	armed.Store(false)
	startPayment(t, d, def, "request-panics")
	if _, err := d.o.Request(context.Background(), "request-panics", saga.ActionPause, alice); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	if _, err := d.o.RunDue(context.Background()); err == nil || !strings.Contains(err.Error(), "a bug") {
		t.Fatalf("RunDue: %v", err)
	}
	if in := d.get("request-panics"); in.Request != nil || in.Status != saga.StatusRunning {
		t.Fatalf("request-panics: %s, request %+v", in.Status, in.Request)
	}
	if r := historyEvents(t, d.o, "request-panics", "operator_refused"); len(r) != 1 || !strings.Contains(string(r[0].Detail), "a bug") {
		t.Fatalf("refusals %+v", r)
	}
}

// retired is a schema where sagas of "order" v1 were scheduled and
// paused by an orchestrator that had v1 (old), and a newer one (current)
// has only v2.
type retired struct {
	*driver
	v1, v2  *saga.Definition[order]
	current *saga.Orchestrator
}

func setupRetired(t *testing.T) *retired {
	t.Helper()
	r := &retired{}
	r.driver = setupDriver(t, func(b *testBundle) []saga.Registrable {
		r.v1, r.v2 = mustDefine(t, orderSpec(b, 1)), mustDefine(t, orderSpec(b, 2))
		return []saga.Registrable{r.v1, r.v2}
	})
	var err error
	r.current, err = saga.New(r.db.Pool, saga.Config{Schema: r.db.Schema, Writer: r.w, Clock: r.clock, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.current.Register(r.v2); err != nil {
		t.Fatal(err)
	}
	return r
}

// scheduleV1 schedules a v1 saga an hour from now.
func (r *retired) scheduleV1(id string) {
	r.t.Helper()
	if _, err := saga.Start(context.Background(), r.o, r.v1, id, order{ID: id, Amount: 1}, saga.StartAt(r.clock.Now().Add(time.Hour))); err != nil {
		r.t.Fatal(err)
	}
}

// A scheduled saga on a version nobody registers any more does not hang
// unnoticed: Migrate moves it (it stays scheduled, with its start time),
// and an orchestrator without its version parks it as stuck with the
// reason; once its version is there again, Retry starts it (or Abort
// cancels it).
func TestScheduledSagaOnARetiredVersion(t *testing.T) {
	t.Parallel()
	r := setupRetired(t)
	ctx := context.Background()
	r.scheduleV1("sched-migrated")
	n, err := saga.Migrate(ctx, r.o, saga.Migration[order, order]{From: r.v1, To: r.v2, Operator: "alice", Reason: "v1 retires"})
	if n != 1 || err != nil {
		t.Fatalf("Migrate: moved %d, %v", n, err)
	}
	in := r.get("sched-migrated")
	if in.Version != 2 || in.Status != saga.StatusScheduled || in.NextWakeupAt == nil || !in.NextWakeupAt.Equal(r.clock.Now().Add(time.Hour)) {
		t.Fatalf("migrated: v%d %s, start %v", in.Version, in.Status, in.NextWakeupAt)
	}
	r.clock.Advance(time.Hour)
	if _, err := r.current.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	if in := r.get("sched-migrated"); in.Status != saga.StatusRunning {
		t.Fatalf("the migrated saga did not start on v2: %s", in.Status)
	}

	for _, id := range []string{"sched-retry", "sched-abort"} {
		r.scheduleV1(id)
	}
	n, err = r.current.ParkUnregistered(ctx)
	if n != 2 || err != nil {
		t.Fatalf("ParkUnregistered: %d, %v", n, err)
	}
	for _, id := range []string{"sched-retry", "sched-abort"} {
		if in := r.get(id); in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "v1 is not registered") {
			t.Fatalf("%s: %s (%s)", id, in.Status, in.LastError)
		}
	}
	// The old orchestrator has v1: Retry starts the saga now, Abort cancels it.
	if _, err := r.o.Retry(ctx, "sched-retry", alice); err != nil {
		t.Fatal(err)
	}
	if in := r.get("sched-retry"); in.Status != saga.StatusRunning || r.last("sched-retry").Step != "credit" {
		t.Fatalf("after Retry: %s at %s", in.Status, in.Step)
	}
	if _, err := r.o.Abort(ctx, "sched-abort", alice); err != nil {
		t.Fatal(err)
	}
	if in := r.get("sched-abort"); in.Status != saga.StatusCompensated || len(r.commands("sched-abort")) != 0 {
		t.Fatalf("after Abort: %s", in.Status)
	}
}

// A paused saga on a version nobody registers any more: Migrate moves it
// (still paused), an orchestrator without its version marks it with the
// reason and refuses the Resume request waiting on it (instead of leaving
// it pending for ever), and a reply that arrives for it there is held for
// Resume, not fenced.
func TestPausedSagaOnARetiredVersion(t *testing.T) {
	t.Parallel()
	r := setupRetired(t)
	ctx := context.Background()
	for _, id := range []string{"paused-a", "paused-b"} {
		start(t, r.testBundle, r.v1, id, 1)
		if _, err := r.o.Pause(ctx, id, alice); err != nil {
			t.Fatal(err)
		}
	}
	credit := r.last("paused-a")
	if _, err := r.current.Request(ctx, "paused-a", saga.ActionResume, saga.Actor{Operator: "bob", Reason: "go on"}); err != nil {
		t.Fatal(err)
	}
	// The reply to its credit command reaches the orchestrator without v1.
	res, err := r.current.HandleReplies(ctx, []*message.Message{replyMsg("paused-a", credit, core.OutcomeSuccess, "", `{"tx":"t1"}`)})
	if err != nil || res.Fenced != 0 {
		t.Fatalf("reply: %+v, %v", res, err)
	}
	if n := len(historyEvents(t, r.o, "paused-a", "held")); n != 1 {
		t.Fatalf("%d held lines, want the reply held", n)
	}
	// paused-a was marked by its reply; paused-b is now.
	n, err := r.current.ParkUnregistered(ctx)
	if n != 1 || err != nil {
		t.Fatalf("ParkUnregistered: %d, %v", n, err)
	}
	in := r.get("paused-a")
	if in.Status != saga.StatusPaused || in.Request != nil || !strings.Contains(in.LastError, "v1 is not registered") {
		t.Fatalf("paused-a: %s (%s), request %+v", in.Status, in.LastError, in.Request)
	}
	refusals := historyEvents(t, r.o, "paused-a", "operator_refused")
	if len(refusals) != 1 || !strings.Contains(string(refusals[0].Detail), "not registered") {
		t.Fatalf("refusals %+v", refusals)
	}
	// Again: nothing new (no second line, nothing counted).
	if n, err := r.current.ParkUnregistered(ctx); n != 0 || err != nil {
		t.Fatalf("second ParkUnregistered: %d, %v", n, err)
	}
	// Migrated, it stays paused; resumed on v2, its held reply applies.
	n, err = saga.Migrate(ctx, r.o, saga.Migration[order, order]{From: r.v1, To: r.v2, Operator: "alice", Reason: "v1 retires"})
	if n != 2 || err != nil {
		t.Fatalf("Migrate: moved %d, %v", n, err)
	}
	if in := r.get("paused-b"); in.Version != 2 || in.Status != saga.StatusPaused {
		t.Fatalf("paused-b: v%d %s", in.Version, in.Status)
	}
	if _, err := r.current.Resume(ctx, "paused-a", saga.Actor{Operator: "bob", Reason: "on v2"}); err != nil {
		t.Fatal(err)
	}
	if in := r.get("paused-a"); in.Status != saga.StatusRunning || in.Steps["credit"].Status != saga.StepDone || in.Step != "stock" {
		t.Fatalf("resumed: %s at %s, credit %+v", in.Status, in.Step, in.Steps["credit"])
	}
}

// A message copied to two topics (one UUID), read by two EventHandlers
// that route it to two sagas, applies to both: EventHandler deduplicates
// by the event (saga and event id), not by an inbox mark under the
// consumer name the reply handler uses too. A redelivery to either still
// applies once.
func TestEventHandlersOnTwoTopicsApplyACopyEach(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	for _, id := range []string{"copy-a", "copy-b"} {
		startPayment(t, d, def, id)
		d.reply(id, d.last(id), core.OutcomeSuccess) // waiting
	}
	to := func(id string) message.NoPublishHandlerFunc {
		return d.o.EventHandler(func(*message.Message) (saga.EventTarget, error) {
			return saga.EventTarget{SagaID: id, Event: "payment.confirmed"}, nil
		})
	}
	psp, audit := to("copy-a"), to("copy-b")
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"ref":"fanned"}`))
	for _, h := range []message.NoPublishHandlerFunc{psp, audit, psp, audit} {
		if err := h(msg.Copy()); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"copy-a", "copy-b"} {
		in := d.get(id)
		if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"fanned"}) {
			t.Fatalf("%s: %s, data %+v", id, in.Status, p)
		}
		if got := d.effects(id); len(got) != 1 {
			t.Fatalf("%s: effects %v", id, got)
		}
	}
}

// The service's retention removing an ended saga while an event for it
// comes: the event is either refused and kept with the saga (the signaller
// holds the saga's key, so retention passes over it this time) or, once
// the saga is gone, refused as not found; it is never stored without its
// saga, to be inherited by a new saga with the same id, which would then
// drop its own event of that id as a duplicate.
func TestSignalRacingRetentionLeavesNoOrphan(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	ctx := context.Background()
	id := "reused"
	startPayment(t, d, def, id)
	d.reply(id, d.last(id), core.OutcomeFailure) // compensated: ended
	if in := d.get(id); in.Status != saga.StatusCompensated {
		t.Fatalf("status %s", in.Status)
	}
	// Retention's removal of the saga, as internal/retention does it: the
	// row locked, its history, events and row deleted, not committed yet.
	rtx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rtx.Rollback(ctx)
	for _, q := range []string{
		`SELECT id FROM ` + d.tbl("saga_instance") + ` WHERE id = $1 FOR UPDATE SKIP LOCKED`,
		`DELETE FROM ` + d.tbl("saga_history") + ` WHERE saga_id = $1`,
		`DELETE FROM ` + d.tbl("saga_event") + ` WHERE saga_id = $1`,
		`DELETE FROM ` + d.tbl("saga_instance") + ` WHERE id = $1`,
	} {
		if _, err := rtx.Exec(ctx, q, id); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- saga.Signal(ctx, d.o, id, "payment.confirmed", "psp-1", confirmation{Ref: "late"}) }()
	// Commit the removal once the signaller waits for it, or has finished.
	deadline := time.Now().Add(10 * time.Second)
	var signalled error
	for waiting := false; !waiting; {
		select {
		case signalled = <-done:
			waiting = true
		default:
		}
		if !waiting {
			err := d.db.Pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%'`, d.db.Schema).Scan(&waiting)
			if err != nil {
				t.Fatal(err)
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the signaller neither waited nor finished")
		}
	}
	if err := rtx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if signalled == nil {
		signalled = <-done
	}
	if !errors.Is(signalled, saga.ErrNotFound) && !errors.Is(signalled, saga.ErrSagaEnded) {
		t.Fatalf("Signal: %v", signalled)
	}
	var orphans int
	err = d.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+d.tbl("saga_event")+` WHERE saga_id = $1)
 + (SELECT count(*) FROM `+d.tbl("saga_history")+` WHERE saga_id = $1)`, id).Scan(&orphans)
	if err != nil {
		t.Fatal(err)
	}
	if orphans != 0 {
		t.Fatalf("%d rows of the removed saga left (Signal: %v)", orphans, signalled)
	}
	// A new saga with the id takes its own event of that id.
	startPayment(t, d, def, id)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.signal(id, "payment.confirmed", "psp-1", confirmation{Ref: "new"})
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("the new saga: %s, events %v", in.Status, d.eventStates(id))
	}
}

// A saga whose new events fail technically on the timer pass (a database
// error applying them) is handled as a failing timer: a "timer_failed"
// line per failure, tried again after a backoff (not on every pass),
// parked as stuck after Config.MaxTimerFailures with the error, its event
// kept for an operator's Retry.
func TestNewEventsFailingTechnicallyBackOffAndPark(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	ctx := context.Background()
	id := "ev-fails"
	startPayment(t, d, def, id)
	d.reply(id, d.last(id), core.OutcomeSuccess) // waiting
	// Consuming the event fails in the database.
	_, err := d.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = 'consumed' THEN RAISE EXCEPTION 'the ledger table is full'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER boom BEFORE UPDATE ON %[2]s FOR EACH ROW EXECUTE FUNCTION %[1]s()`, d.tbl("boom"), d.tbl("saga_event")))
	if err != nil {
		t.Fatal(err)
	}
	// The event is stored as new: the orchestrator held the saga.
	held, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.Exec(ctx, `SELECT 1 FROM `+d.tbl("saga_instance")+` WHERE id = $1 FOR NO KEY UPDATE`, id); err != nil {
		t.Fatal(err)
	}
	d.signal(id, "payment.confirmed", "psp", confirmation{Ref: "r"})
	if err := held.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	failures := func() int { return len(historyEvents(t, d.o, id, "timer_failed")) }
	for i := 1; i <= 5; i++ {
		_, err := d.o.RunDue(ctx)
		if err == nil || !strings.Contains(err.Error(), "the ledger table is full") {
			t.Fatalf("pass %d: %v", i, err)
		}
		if n := failures(); n != i {
			t.Fatalf("after failure %d: %d timer_failed lines", i, n)
		}
		if i < 5 {
			// At once again: it waits for its backoff.
			if _, err := d.o.RunDue(ctx); err != nil {
				t.Fatalf("pass %d again: %v", i, err)
			}
			if n := failures(); n != i {
				t.Fatalf("tried again before its backoff: %d lines", n)
			}
			d.clock.Advance(time.Minute)
		}
	}
	in := d.get(id)
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "the ledger table is full") {
		t.Fatalf("after 5 failures: %s (%s)", in.Status, in.LastError)
	}
	d.tick(time.Hour) // the next pass files the event for the stuck saga; nothing fails
	if n := failures(); n != 5 {
		t.Fatalf("%d timer_failed lines after parking", n)
	}
	if got := d.eventStates(id); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
		t.Fatalf("events %v", got)
	}
	if _, err := d.db.Pool.Exec(ctx, `DROP TRIGGER boom ON `+d.tbl("saga_event")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.o.Retry(ctx, id, alice); err != nil {
		t.Fatal(err)
	}
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("after Retry: %s (%s)", in.Status, in.LastError)
	}
}

// A saga whose compensation got stuck and that an operator retried ends
// compensated with the reason it compensated for as its last error (and
// its last history line), not the past "failed N times" of the
// compensation; one retried forward no longer shows the old error while
// it runs.
func TestRecoveredSagaDropsItsPastError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := "recovered"
	d := stuckSoon(t, id) // stock failed; credit's compensation failed twice: stuck
	in := d.get(id)
	if !strings.Contains(in.LastError, "compensation of step credit failed") {
		t.Fatalf("stuck with %q", in.LastError)
	}
	if _, err := d.o.Retry(ctx, id, alice); err != nil {
		t.Fatal(err)
	}
	if in := d.get(id); strings.Contains(in.LastError, "compensation of step credit failed") {
		t.Fatalf("compensating again, the last error is still the past one: %q", in.LastError)
	}
	d.reply(id, d.last(id), core.OutcomeSuccess)
	in = d.get(id)
	h := historyOf(t, d.o, id)
	last := h[len(h)-1]
	if in.Status != saga.StatusCompensated || !strings.HasPrefix(in.LastError, "step stock failed") || last.Reason != in.LastError {
		t.Fatalf("%s, last error %q, last line %s %q", in.Status, in.LastError, last.Event, last.Reason)
	}

	// Forward: a stuck step retried runs without its past error.
	d2, def := orderDriver(t, func(s *saga.Spec[order]) { s.Steps[2].OnTimeout = saga.TimeoutStuck })
	stockRunning(t, d2, def, "fwd")
	d2.tick(time.Second) // stock's timeout: stuck
	if in := d2.get("fwd"); in.Status != saga.StatusStuck {
		t.Fatalf("fwd: %s", in.Status)
	}
	if _, err := d2.o.Retry(ctx, "fwd", alice); err != nil {
		t.Fatal(err)
	}
	if in := d2.get("fwd"); in.Status != saga.StatusRunning || in.LastError != "" {
		t.Fatalf("fwd after Retry: %s, last error %q", in.Status, in.LastError)
	}
}

// An event held for a paused saga has its history line at once ("event",
// outcome held), and every event line carries the time the event arrived
// (detail "arrived_at"), which the line's own time is not when the event
// waited: the consumed line after Resume says when it came.
func TestEventLinesSayWhenTheEventArrived(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	ctx := context.Background()
	startPayment(t, d, def, "held-ev")
	d.reply("held-ev", d.last("held-ev"), core.OutcomeSuccess) // waiting
	if _, err := d.o.Pause(ctx, "held-ev", alice); err != nil {
		t.Fatal(err)
	}
	arrived := d.clock.Now()
	d.signal("held-ev", "payment.confirmed", "psp", confirmation{Ref: "r"})
	arrivedAt := func(h saga.HistoryEntry) time.Time {
		var detail struct {
			At time.Time `json:"arrived_at"`
		}
		if err := json.Unmarshal(h.Detail, &detail); err != nil {
			t.Fatal(err)
		}
		return detail.At
	}
	lines := historyEvents(t, d.o, "held-ev", "event")
	if len(lines) != 1 || lines[0].Outcome != "held" || !arrivedAt(lines[0]).Equal(arrived) {
		t.Fatalf("while paused: %+v", lines)
	}
	d.clock.Advance(time.Hour)
	if _, err := d.o.Resume(ctx, "held-ev", alice); err != nil {
		t.Fatal(err)
	}
	lines = historyEvents(t, d.o, "held-ev", "event")
	last := lines[len(lines)-1]
	if last.Outcome != "consumed" || !arrivedAt(last).Equal(arrived) || last.At.Equal(arrived) {
		t.Fatalf("after Resume: %+v", last)
	}
}

// The timer pass that applies a saga's new events (left to it after a
// timer failure) and then fires its due timeout saves that timeout, even
// when the event was only filed (kept pending for a wait ahead).
func TestTimerAfterFiledEventsSavesTheTimeout(t *testing.T) {
	t.Parallel()
	var failOnce atomic.Bool
	failOnce.Store(true)
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		if p == sagahook.Loaded && id == "filed" && failOnce.CompareAndSwap(true, false) {
			return errors.New("injected")
		}
		return nil
	}
	d, def := setupAwait(t, single, bundleOptions{hook: hook})
	ctx := context.Background()
	startPayment(t, d, def, "filed") // at reserve, its timeout in an hour
	d.clock.Advance(time.Hour)
	if _, err := d.o.RunDue(ctx); err == nil { // the timer fails once: timer_failed, postponed
		t.Fatal("the injected failure did not fail the timer")
	}
	// An event for the wait ahead, stored as new: the orchestrator held the saga.
	held, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.Exec(ctx, `SELECT 1 FROM `+d.tbl("saga_instance")+` WHERE id = 'filed' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	d.signal("filed", "payment.confirmed", "psp", confirmation{Ref: "early"})
	if err := held.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	d.tick(time.Minute) // past the backoff: the timer pass files the event, then times reserve out
	in := d.get("filed")
	if st := in.Steps["reserve"]; st.Status != saga.StepBackoff || in.NextWakeupAt == nil {
		t.Fatalf("reserve %+v, next wake-up %v: the timeout was not saved", st, in.NextWakeupAt)
	}
	if got := d.eventStates("filed"); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
		t.Fatalf("events %v", got)
	}
	if n := len(historyEvents(t, d.o, "filed", "timeout")); n != 1 {
		t.Fatalf("%d timeout lines", n)
	}
}

// An operator's Retry of a stuck all-of wait whose only stored event is a
// second copy of a name it applied (filed as ignored) is saved: the saga
// waits again. Filing the copy marked the machine as only fenced, and the
// Retry's new state was not written.
func TestRetryThatOnlyFilesAnEventIsSaved(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, saga.Await[payment]{All: []string{"signed", "verified"}, OnEvent: record("x"),
		Timeout: time.Hour, OnTimeout: saga.TimeoutStuck}, bundleOptions{})
	ctx := context.Background()
	startPayment(t, d, def, "dup")
	d.reply("dup", d.last("dup"), core.OutcomeSuccess)
	d.signal("dup", "signed", "s1", nil)
	d.tick(time.Hour)                    // stuck: verified never came
	d.signal("dup", "signed", "s2", nil) // a second signed, kept for the stuck wait
	if in := d.get("dup"); in.Status != saga.StatusStuck {
		t.Fatalf("%s", in.Status)
	}
	if _, err := d.o.Retry(ctx, "dup", alice); err != nil {
		t.Fatal(err)
	}
	if in := d.get("dup"); in.Status != saga.StatusRunning || in.Steps["paid"].Status != saga.StepWaiting {
		t.Fatalf("after Retry: %s, paid %+v", in.Status, in.Steps["paid"])
	}
}
