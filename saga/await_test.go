package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// payment is the wait tests' data.
type payment struct {
	ID string `json:"id"`
	// Got lists the events applied, in order.
	Got []string `json:"got,omitempty"`
	Ref string   `json:"ref,omitempty"`
}

type confirmation struct {
	Ref string `json:"ref"`
}

// paymentSpec: reserve stock (remote, compensatable), wait for the
// payment (wait), ship (local pivot, recorded as an effect).
func paymentSpec(b *testBundle, wait saga.Await[payment]) saga.Spec[payment] {
	if wait.OnEvent == nil {
		wait.OnEvent = func(p *payment, raw json.RawMessage) error {
			var c confirmation
			_ = json.Unmarshal(raw, &c)
			p.Got, p.Ref = append(p.Got, c.Ref), c.Ref
			return nil
		}
	}
	return saga.Spec[payment]{
		Type: "order", Version: 1,
		Steps: []saga.Step[payment]{
			{Name: "reserve", Kind: saga.Compensatable, Action: &saga.Command[payment]{Topic: "stock"},
				Compensation: &saga.Command[payment]{}, Timeout: time.Hour},
			{Name: "paid", Kind: saga.Compensatable, Await: &wait},
			{Name: "ship", Kind: saga.Pivot, Local: func(ctx context.Context, tx pgx.Tx, p *payment) error {
				_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, what) VALUES ($1, 'ship', 'do')`, b.tbl("test_effect")), p.ID)
				return err
			}},
		},
	}
}

func setupAwait(t *testing.T, wait saga.Await[payment], opts bundleOptions) (*driver, *saga.Definition[payment]) {
	t.Helper()
	clock := newManualClock()
	opts.clock = clock
	b := setup(t, opts)
	def := mustDefine(t, paymentSpec(b, wait))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	return &driver{testBundle: b, clock: clock, handler: b.o.Handler()}, def
}

func startPayment(t *testing.T, d *driver, def *saga.Definition[payment], id string) {
	t.Helper()
	if _, err := saga.Start(context.Background(), d.o, def, id, payment{ID: id}); err != nil {
		t.Fatal(err)
	}
}

func (d *driver) signal(id, event, eventID string, payload any) {
	d.t.Helper()
	if err := saga.Signal(context.Background(), d.o, id, event, eventID, payload); err != nil {
		d.t.Fatal(err)
	}
}

// eventStates returns the saga's stored events as "name/state", in order of arrival.
func (d *driver) eventStates(id string) []string {
	d.t.Helper()
	rows, err := d.db.Pool.Query(context.Background(), `SELECT name || '/' || state FROM `+d.tbl("saga_event")+` WHERE saga_id = $1 ORDER BY arrived`, id)
	if err != nil {
		d.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// eventOutcomes returns the outcomes of the saga's "event" history lines.
func eventOutcomes(t testing.TB, o *saga.Orchestrator, id string) []string {
	var out []string
	for _, h := range historyOf(t, o, id) {
		if h.Event == "event" {
			out = append(out, h.Outcome)
		}
	}
	return out
}

func paymentOf(t testing.TB, in *saga.Instance) payment {
	t.Helper()
	var p payment
	if err := json.Unmarshal(in.Data, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

var single = saga.Await[payment]{Event: "payment.confirmed", Timeout: 15 * time.Minute, OnTimeout: saga.TimeoutCompensate}

// An event delivered before the saga reaches its wait is stored and
// consumed when the saga gets there.
func TestAwaitEventBeforeTheWaitIsConsumedWhenReached(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	startPayment(t, d, def, "p-1")
	d.signal("p-1", "payment.confirmed", "psp-1", confirmation{Ref: "r1"})
	if got := d.eventStates("p-1"); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
		t.Fatalf("events %v", got)
	}
	if in := d.get("p-1"); in.Step != "reserve" || in.Status != saga.StatusRunning {
		t.Fatalf("saga moved on an early event: %s %s", in.Status, in.Step)
	}
	d.reply("p-1", d.last("p-1"), core.OutcomeSuccess)
	in := d.get("p-1")
	if in.Status != saga.StatusCompleted {
		t.Fatalf("status %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if p := paymentOf(t, in); !slices.Equal(p.Got, []string{"r1"}) {
		t.Fatalf("data %+v", p)
	}
	if got := d.eventStates("p-1"); !slices.Equal(got, []string{"payment.confirmed/consumed"}) {
		t.Fatalf("events %v", got)
	}
	if got := eventOutcomes(t, d.o, "p-1"); !slices.Equal(got, []string{"pending", "consumed"}) {
		t.Fatalf("history outcomes %v", got)
	}
	if got := d.effects("p-1"); !slices.Equal(got, []string{"ship:do"}) {
		t.Fatalf("effects %v", got)
	}
}

// The same event delivered three times (early, while waiting, after the
// end) applies once; the duplicates return nil.
func TestAwaitEventDeliveredThreeTimesAppliesOnce(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	startPayment(t, d, def, "p-2")
	d.signal("p-2", "payment.confirmed", "psp-2", confirmation{Ref: "r"})
	d.reply("p-2", d.last("p-2"), core.OutcomeSuccess)
	d.signal("p-2", "payment.confirmed", "psp-2", confirmation{Ref: "r"})
	d.signal("p-2", "payment.confirmed", "psp-2", confirmation{Ref: "r"})
	in := d.get("p-2")
	if p := paymentOf(t, in); in.Status != saga.StatusCompleted || len(p.Got) != 1 {
		t.Fatalf("status %s data %+v", in.Status, p)
	}
	if got := d.eventStates("p-2"); len(got) != 1 {
		t.Fatalf("events %v", got)
	}

	// Through a topic: the inbox deduplicates the message, the table the event id.
	startPayment(t, d, def, "p-3")
	d.reply("p-3", d.last("p-3"), core.OutcomeSuccess) // now waiting
	h := d.o.EventHandler(func(msg *message.Message) (saga.EventTarget, error) {
		return saga.EventTarget{SagaID: msg.Metadata.Get("order"), Event: "payment.confirmed", EventID: msg.Metadata.Get("psp_id")}, nil
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"ref":"t"}`))
	msg.Metadata.Set("order", "p-3")
	msg.Metadata.Set("psp_id", "psp-3")
	other := message.NewMessage(watermill.NewUUID(), msg.Payload) // redelivered by the provider: a new message, the same id
	other.Metadata = msg.Metadata
	for _, m := range []*message.Message{msg, msg, other} {
		if err := h(m); err != nil {
			t.Fatal(err)
		}
	}
	in = d.get("p-3")
	if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"t"}) {
		t.Fatalf("status %s data %+v", in.Status, p)
	}
	if got := d.effects("p-3"); len(got) != 1 {
		t.Fatalf("effects %v", got)
	}
}

// An event for an ended saga, or of a name nothing waits for, is refused
// with an error and recorded in the history.
func TestAwaitRefusesEndedSagaAndUnknownEvent(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	ctx := context.Background()
	startPayment(t, d, def, "p-4")
	err := saga.Signal(ctx, d.o, "p-4", "payment.nope", "x-1", nil)
	if !errors.Is(err, saga.ErrEventNotAwaited) {
		t.Fatalf("unknown event: %v", err)
	}
	d.reply("p-4", d.last("p-4"), core.OutcomeSuccess)
	d.signal("p-4", "payment.confirmed", "psp-4", confirmation{Ref: "r"})
	if in := d.get("p-4"); in.Status != saga.StatusCompleted {
		t.Fatalf("status %s", in.Status)
	}
	err = saga.Signal(ctx, d.o, "p-4", "payment.confirmed", "psp-4b", confirmation{Ref: "late"})
	if !errors.Is(err, saga.ErrSagaEnded) {
		t.Fatalf("ended saga: %v", err)
	}
	if got := d.eventStates("p-4"); !slices.Equal(got, []string{"payment.nope/refused", "payment.confirmed/consumed", "payment.confirmed/refused"}) {
		t.Fatalf("events %v", got)
	}
	var refused []string
	for _, h := range historyOf(t, d.o, "p-4") {
		if h.Event == "event" && h.Outcome == "refused" {
			refused = append(refused, h.Reason)
		}
	}
	if len(refused) != 2 || !strings.Contains(refused[0], "no step") || !strings.Contains(refused[1], "completed") {
		t.Fatalf("refusals in history %q", refused)
	}
	if err := saga.Signal(ctx, d.o, "nobody", "payment.confirmed", "x", nil); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("unknown saga: %v", err)
	}
	if err := saga.Signal(ctx, d.o, "p-4", "bad\x00name", "x", nil); !errors.Is(err, saga.ErrInvalidEvent) {
		t.Fatalf("bad name: %v", err)
	}
	// SignalTx writes the refusal in the caller's transaction.
	tx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := saga.SignalTx(ctx, tx, d.o, "p-4", "payment.confirmed", "psp-4c", nil); !errors.Is(err, saga.ErrSagaEnded) {
		t.Fatalf("SignalTx on an ended saga: %v", err)
	}
}

// No race: an event committed while the orchestrator holds the saga,
// advancing it into the wait (after it looked for stored events), is
// neither blocked on nor missed: the signaller stores it as new without
// waiting, and the timer pass applies it.
func TestAwaitEventSignalledWhileTheOrchestratorEntersTheWait(t *testing.T) {
	t.Parallel()
	var (
		d         *driver
		mu        sync.Mutex
		armed     bool
		signalled bool
		inHook    error
	)
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		mu.Lock()
		defer mu.Unlock()
		if p != sagahook.BeforeCommit || id != "p-5" || !armed || signalled {
			return nil
		}
		signalled = true
		// The reply's transaction holds the row, the saga is in its wait
		// (uncommitted), its stored events read: signal from another
		// transaction, which must not wait for this one.
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		inHook = saga.Signal(sctx, d.o, "p-5", "payment.confirmed", "psp-5", confirmation{Ref: "racing"})
		return nil
	}
	d, def := setupAwait(t, single, bundleOptions{hook: hook})
	startPayment(t, d, def, "p-5")
	mu.Lock()
	armed = true
	mu.Unlock()
	d.reply("p-5", d.last("p-5"), core.OutcomeSuccess)
	if inHook != nil || !signalled {
		t.Fatalf("signal during the orchestrator's transaction: %v (signalled %v)", inHook, signalled)
	}
	if in := d.get("p-5"); in.Step != "paid" || in.Steps["paid"].Status != saga.StepWaiting {
		t.Fatalf("saga at %s %+v", in.Step, in.Steps["paid"])
	}
	if got := d.eventStates("p-5"); !slices.Equal(got, []string{"payment.confirmed/new"}) {
		t.Fatalf("events %v", got)
	}
	d.tick(0) // the timer pass
	in := d.get("p-5")
	if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"racing"}) {
		t.Fatalf("status %s data %+v", in.Status, p)
	}
}

// Any-of: two events race in two transactions; exactly one wins, on
// every run, whatever the interleaving (seed printed; set
// SAGA_AWAIT_SEED to replay one).
func TestAwaitAnyOfRaceExactlyOneWins(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SAGA_AWAIT_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (SAGA_AWAIT_SEED=%d to replay)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	wait := saga.Await[payment]{Any: []string{"approved", "rejected"}, On: map[string]func(*payment, json.RawMessage) error{
		"approved": func(p *payment, _ json.RawMessage) error { p.Got = append(p.Got, "approved"); return nil },
		"rejected": func(p *payment, _ json.RawMessage) error { p.Got = append(p.Got, "rejected"); return nil },
	}}
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock})
	spec := paymentSpec(b, wait)
	// A remote step after the wait keeps the saga running after the winner.
	spec.Steps = append(spec.Steps, saga.Step[payment]{Name: "notify", Kind: saga.Retriable, Action: &saga.Command[payment]{Topic: "mail"},
		Retry: saga.RetryPolicy{MaxAttempts: 3}, Timeout: time.Hour})
	def := mustDefine(t, spec)
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
	ctx := context.Background()
	const rounds = 12
	for r := range rounds {
		id := fmt.Sprintf("any-%d", r)
		startPayment(t, d, def, id)
		early := rng.IntN(3) == 0 // both before the saga waits, sometimes
		if !early {
			d.reply(id, d.last(id), core.OutcomeSuccess)
		}
		txs := make([]pgx.Tx, 2)
		for i := range txs {
			tx, err := d.db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			txs[i] = tx
		}
		names := []string{"approved", "rejected"}
		signal := func(i int) error { return saga.SignalTx(ctx, txs[i], d.o, id, names[i], "e"+strconv.Itoa(i), nil) }
		if rng.IntN(2) == 0 {
			// Concurrently.
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range 2 {
				wg.Go(func() {
					if errs[i] = signal(i); errs[i] == nil {
						errs[i] = txs[i].Commit(ctx)
					}
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		} else {
			// A random interleaving of signal 0, signal 1, commit 0, commit 1.
			ops := []int{0, 1, 2, 3} // i < 2: signal i; else commit i-2
			for {
				rng.Shuffle(len(ops), func(a, b int) { ops[a], ops[b] = ops[b], ops[a] })
				if slices.Index(ops, 0) < slices.Index(ops, 2) && slices.Index(ops, 1) < slices.Index(ops, 3) {
					break
				}
			}
			for _, op := range ops {
				var err error
				if op < 2 {
					err = signal(op)
				} else {
					err = txs[op-2].Commit(ctx)
				}
				if err != nil {
					t.Fatalf("round %d op %d: %v", r, op, err)
				}
			}
		}
		if early {
			d.reply(id, d.last(id), core.OutcomeSuccess)
		}
		d.tick(0)
		in := d.get(id)
		p := paymentOf(t, in)
		states := d.eventStates(id)
		consumed := 0
		for _, s := range states {
			if strings.HasSuffix(s, "/consumed") {
				consumed++
			} else if !strings.HasSuffix(s, "/ignored") {
				t.Fatalf("round %d: event %s", r, s)
			}
		}
		if in.Status != saga.StatusRunning || in.Step != "notify" || len(p.Got) != 1 || consumed != 1 || len(states) != 2 {
			t.Fatalf("round %d (seed %d): status %s, applied %v, events %v", r, seed, in.Status, p.Got, states)
		}
		if !strings.HasPrefix(states[0], p.Got[0]) && !early && len(states) == 2 {
			// The first to arrive wins when both were filed in order;
			// arrival is the order of the events' inserts.
			t.Logf("round %d: %v won over the first arrived %v", r, p.Got, states)
		}
	}
}

// All-of completes only when every event has arrived, each applied in
// order of arrival; a second event of a name already applied is ignored.
func TestAwaitAllOfCompletesWhenEveryEventArrived(t *testing.T) {
	t.Parallel()
	wait := saga.Await[payment]{All: []string{"signed", "verified", "deposit"}, OnEvent: saga.EventFunc(func(p *payment, c confirmation) error {
		p.Got = append(p.Got, c.Ref)
		return nil
	})}
	d, def := setupAwait(t, wait, bundleOptions{})
	startPayment(t, d, def, "all-1")
	d.signal("all-1", "verified", "v", confirmation{Ref: "verified"}) // early
	d.reply("all-1", d.last("all-1"), core.OutcomeSuccess)
	d.signal("all-1", "deposit", "d", confirmation{Ref: "deposit"})
	d.signal("all-1", "deposit", "d2", confirmation{Ref: "deposit again"})
	in := d.get("all-1")
	if in.Status != saga.StatusRunning || in.Step != "paid" || !slices.Equal(in.Steps["paid"].Events, []string{"verified", "deposit"}) {
		t.Fatalf("before the last event: %s at %s %+v", in.Status, in.Step, in.Steps["paid"])
	}
	d.signal("all-1", "signed", "s", confirmation{Ref: "signed"})
	in = d.get("all-1")
	if p := paymentOf(t, in); in.Status != saga.StatusCompleted || !slices.Equal(p.Got, []string{"verified", "deposit", "signed"}) {
		t.Fatalf("status %s data %+v", in.Status, p)
	}
	if got := d.eventStates("all-1"); !slices.Equal(got, []string{"verified/consumed", "deposit/consumed", "deposit/ignored", "signed/consumed"}) {
		t.Fatalf("events %v", got)
	}
}

// The wait's timeout does what it declares: compensate, park as stuck, or
// go on to the next step. An event after the timeout is recorded and
// ignored.
func TestAwaitTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		action saga.TimeoutAction
		want   saga.Status
	}{
		{saga.TimeoutCompensate, saga.StatusCompensating},
		{saga.TimeoutStuck, saga.StatusStuck},
		{saga.TimeoutContinue, saga.StatusCompleted},
	} {
		t.Run(tc.action.String(), func(t *testing.T) {
			t.Parallel()
			wait := single
			wait.OnTimeout = tc.action
			d, def := setupAwait(t, wait, bundleOptions{})
			startPayment(t, d, def, "t")
			d.reply("t", d.last("t"), core.OutcomeSuccess)
			d.tick(14 * time.Minute)
			if in := d.get("t"); in.Status != saga.StatusRunning || in.Step != "paid" {
				t.Fatalf("before the timeout: %s at %s", in.Status, in.Step)
			}
			d.tick(time.Minute)
			in := d.get("t")
			if in.Status != tc.want {
				t.Fatalf("status %s at %s (%s), want %s", in.Status, in.Step, in.LastError, tc.want)
			}
			switch tc.action {
			case saga.TimeoutCompensate:
				c := d.last("t")
				if c.Step != "reserve" || c.Op != core.OperationCompensation {
					t.Fatalf("last command %+v", c)
				}
				d.reply("t", c, core.OutcomeSuccess)
				if in := d.get("t"); in.Status != saga.StatusCompensated {
					t.Fatalf("status %s", in.Status)
				}
				if got := d.effects("t"); len(got) != 0 {
					t.Fatalf("effects %v", got)
				}
			case saga.TimeoutStuck:
				if !strings.Contains(in.LastError, "waited 15m0s for payment.confirmed") {
					t.Fatalf("last error %q", in.LastError)
				}
				// Stuck, the saga still takes the event; an operator's Retry waits again and consumes it.
				d.signal("t", "payment.confirmed", "late", confirmation{Ref: "late"})
				if _, err := d.o.Retry(context.Background(), "t", saga.Actor{Operator: "ops", Reason: "paid meanwhile"}); err != nil {
					t.Fatal(err)
				}
				if in := d.get("t"); in.Status != saga.StatusCompleted || !slices.Equal(paymentOf(t, in).Got, []string{"late"}) {
					t.Fatalf("after retry: %s %s", in.Status, in.Data)
				}
			case saga.TimeoutContinue:
				if got := d.effects("t"); !slices.Equal(got, []string{"ship:do"}) {
					t.Fatalf("effects %v", got)
				}
				if in.Steps["paid"].Status != saga.StepDone {
					t.Fatalf("paid %+v", in.Steps["paid"])
				}
			}
		})
	}
}

// An event after a wait that went on is recorded and ignored.
func TestAwaitLateEventIsIgnored(t *testing.T) {
	t.Parallel()
	wait := single
	wait.OnTimeout = saga.TimeoutContinue
	spec := func(b *testBundle) saga.Spec[payment] {
		s := paymentSpec(b, wait)
		// A remote step after the wait keeps the saga running.
		s.Steps = append(s.Steps, saga.Step[payment]{Name: "notify", Kind: saga.Retriable, Action: &saga.Command[payment]{Topic: "mail"},
			Retry: saga.RetryPolicy{MaxAttempts: 3}, Timeout: time.Hour})
		return s
	}
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock})
	def := mustDefine(t, spec(b))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
	startPayment(t, d, def, "late")
	d.reply("late", d.last("late"), core.OutcomeSuccess)
	d.tick(15 * time.Minute)
	if in := d.get("late"); in.Step != "notify" {
		t.Fatalf("at %s", in.Step)
	}
	d.signal("late", "payment.confirmed", "psp", confirmation{Ref: "late"})
	if got := d.eventStates("late"); !slices.Equal(got, []string{"payment.confirmed/ignored"}) {
		t.Fatalf("events %v", got)
	}
	if got := eventOutcomes(t, d.o, "late"); !slices.Equal(got, []string{"ignored"}) {
		t.Fatalf("history %v", got)
	}
	if p := paymentOf(t, d.get("late")); len(p.Got) != 0 {
		t.Fatalf("data %+v", p)
	}
}

// A business failure from OnEvent fails the step: the saga compensates.
func TestAwaitOnEventFailureCompensates(t *testing.T) {
	t.Parallel()
	wait := saga.Await[payment]{Any: []string{"payment.confirmed", "payment.declined"}, On: map[string]func(*payment, json.RawMessage) error{
		"payment.declined": func(*payment, json.RawMessage) error { return saga.Fail("card declined") },
	}}
	d, def := setupAwait(t, wait, bundleOptions{})
	startPayment(t, d, def, "dec")
	d.reply("dec", d.last("dec"), core.OutcomeSuccess)
	d.signal("dec", "payment.declined", "x", nil)
	in := d.get("dec")
	if in.Status != saga.StatusCompensating || !strings.Contains(in.LastError, "card declined") {
		t.Fatalf("status %s (%s)", in.Status, in.LastError)
	}
	if c := d.last("dec"); c.Step != "reserve" || c.Op != core.OperationCompensation {
		t.Fatalf("last command %+v", c)
	}
}

func TestDefineRefusesBadWaits(t *testing.T) {
	t.Parallel()
	ok := func() saga.Step[payment] {
		return saga.Step[payment]{Name: "w", Kind: saga.Compensatable, Await: &saga.Await[payment]{Event: "e"}}
	}
	for _, tc := range []struct {
		name string
		edit func(*saga.Step[payment])
		want string
	}{
		{"no event", func(s *saga.Step[payment]) { s.Await.Event = "" }, "exactly one"},
		{"two kinds", func(s *saga.Step[payment]) { s.Await.Any = []string{"a", "b"} }, "exactly one"},
		{"any of one", func(s *saga.Step[payment]) { s.Await.Event, s.Await.Any = "", []string{"a"} }, "at least two"},
		{"duplicate name", func(s *saga.Step[payment]) { s.Await.Event, s.Await.All = "", []string{"a", "a"} }, "twice"},
		{"with action", func(s *saga.Step[payment]) { s.Action = &saga.Command[payment]{Topic: "x"} }, "no Action"},
		{"with remote compensation", func(s *saga.Step[payment]) { s.Compensation = &saga.Command[payment]{Topic: "x"} }, "LocalCompensation"},
		{"in a group", func(s *saga.Step[payment]) { s.Group = "g" }, "group"},
		{"retry timeout", func(s *saga.Step[payment]) { s.Await.Timeout = time.Minute }, "OnTimeout is TimeoutRetry (its zero value, as when it is not set)"},
		{"retry timeout said", func(s *saga.Step[payment]) { s.Await.Timeout, s.Await.OnTimeout = time.Minute, saga.TimeoutRetry }, "a wait has nothing to retry"},
		{"step OnTimeout", func(s *saga.Step[payment]) { s.OnTimeout = saga.TimeoutStuck }, "Await.OnTimeout"},
		{"On for another event", func(s *saga.Step[payment]) {
			s.Await.On = map[string]func(*payment, json.RawMessage) error{"x": nil}
		}, "does not wait for"},
		{"compensate after the pivot", func(s *saga.Step[payment]) {
			s.Kind, s.Await.Timeout, s.Await.OnTimeout = saga.Retriable, time.Minute, saga.TimeoutCompensate
		}, "never compensate"},
	} {
		s := ok()
		tc.edit(&s)
		steps := []saga.Step[payment]{s}
		if s.Kind == saga.Retriable {
			steps = []saga.Step[payment]{{Name: "p", Kind: saga.Pivot, Local: func(context.Context, pgx.Tx, *payment) error { return nil }}, s}
		}
		_, err := saga.Define(saga.Spec[payment]{Type: "t", Version: 1, Steps: steps})
		if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A remote step cannot go on after a timeout.
	_, err := saga.Define(saga.Spec[payment]{Type: "t", Version: 1, Steps: []saga.Step[payment]{
		{Name: "r", Kind: saga.Compensatable, Action: &saga.Command[payment]{Topic: "x"}, OnTimeout: saga.TimeoutContinue}}})
	if !errors.Is(err, core.ErrConfig) {
		t.Errorf("TimeoutContinue on a remote step: %v", err)
	}
	if _, err := saga.Define(saga.Spec[payment]{Type: "t", Version: 1, Steps: []saga.Step[payment]{ok()}}); err != nil {
		t.Errorf("a valid wait: %v", err)
	}
}

// An event for a paused saga that waits is stored, not applied, also by
// the timer pass; Resume applies it and the saga goes on. A scheduled
// saga keeps an early event until its wait.
func TestAwaitPausedSagaTakesItsEventOnResume(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, def := setupAwait(t, single, bundleOptions{})
	startPayment(t, d, def, "p-1")
	d.reply("p-1", d.last("p-1"), core.OutcomeSuccess)
	if in := d.get("p-1"); in.Step != "paid" || in.Status != saga.StatusRunning {
		t.Fatalf("not waiting: %s at %s", in.Status, in.Step)
	}
	by := saga.Actor{Operator: "alice", Reason: "hold the shipment"}
	if _, err := d.o.Pause(ctx, "p-1", by); err != nil {
		t.Fatal(err)
	}
	d.signal("p-1", "payment.confirmed", "psp-1", confirmation{Ref: "r1"})
	if _, err := d.o.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	if in := d.get("p-1"); in.Status != saga.StatusPaused || in.Step != "paid" {
		t.Fatalf("a paused saga moved on an event: %s at %s", in.Status, in.Step)
	}
	if got := d.eventStates("p-1"); !slices.Equal(got, []string{"payment.confirmed/new"}) {
		t.Fatalf("events while paused %v", got)
	}
	if _, err := d.o.Resume(ctx, "p-1", by); err != nil {
		t.Fatal(err)
	}
	in := d.get("p-1")
	if in.Status != saga.StatusCompleted {
		t.Fatalf("after resume: %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if got := d.eventStates("p-1"); !slices.Equal(got, []string{"payment.confirmed/consumed"}) {
		t.Fatalf("events after resume %v", got)
	}
	if got := d.effects("p-1"); !slices.Equal(got, []string{"ship:do"}) {
		t.Fatalf("effects %v", got)
	}

	// Scheduled: the event waits for the start, then for the wait.
	if _, err := saga.Start(ctx, d.o, def, "p-2", payment{ID: "p-2"}, saga.StartAt(d.clock.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	d.signal("p-2", "payment.confirmed", "psp-2", confirmation{Ref: "r2"})
	if got := d.eventStates("p-2"); !slices.Equal(got, []string{"payment.confirmed/new"}) {
		t.Fatalf("events of a scheduled saga %v", got)
	}
	d.clock.Advance(2 * time.Hour)
	if _, err := d.o.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	if in := d.get("p-2"); in.Status != saga.StatusRunning || in.Step != "reserve" {
		t.Fatalf("scheduled saga not started: %s at %s", in.Status, in.Step)
	}
	d.reply("p-2", d.last("p-2"), core.OutcomeSuccess)
	if in := d.get("p-2"); in.Status != saga.StatusCompleted {
		t.Fatalf("scheduled saga after its reply: %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if p := paymentOf(t, d.get("p-2")); !slices.Equal(p.Got, []string{"r2"}) {
		t.Fatalf("data %+v", p)
	}
}

// An OnEvent that fails with an error that is not a business failure (a
// bug, a payload it cannot take) parks the saga stuck with the reason and
// keeps the event; once fixed, Retry applies the event again and the saga
// goes on.
func TestAwaitOnEventErrorParksStuckAndRetryApplies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var broken atomic.Bool
	broken.Store(true)
	wait := single
	wait.OnEvent = func(p *payment, raw json.RawMessage) error {
		if broken.Load() {
			return errors.New("cannot read the provider's reference")
		}
		var c confirmation
		_ = json.Unmarshal(raw, &c)
		p.Got = append(p.Got, c.Ref)
		return nil
	}
	d, def := setupAwait(t, wait, bundleOptions{})
	startPayment(t, d, def, "p-1")
	d.reply("p-1", d.last("p-1"), core.OutcomeSuccess)
	d.signal("p-1", "payment.confirmed", "psp-1", confirmation{Ref: "r1"})
	in := d.get("p-1")
	if in.Status != saga.StatusStuck || in.Step != "paid" || !strings.Contains(in.LastError, "cannot read the provider's reference") {
		t.Fatalf("after a failing OnEvent: %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if got := d.eventStates("p-1"); len(got) != 1 || got[0] == "payment.confirmed/consumed" {
		t.Fatalf("the event was not kept for a retry: %v", got)
	}
	broken.Store(false)
	if _, err := d.o.Retry(ctx, "p-1", saga.Actor{Operator: "alice", Reason: "parser fixed"}); err != nil {
		t.Fatal(err)
	}
	in = d.get("p-1")
	if in.Status != saga.StatusCompleted {
		t.Fatalf("after Retry: %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if p := paymentOf(t, in); !slices.Equal(p.Got, []string{"r1"}) {
		t.Fatalf("data %+v: the event applied %d times", p, len(p.Got))
	}
	if got := d.eventStates("p-1"); !slices.Equal(got, []string{"payment.confirmed/consumed"}) {
		t.Fatalf("events %v", got)
	}
}

// The saga's deadline passes while it waits: it compensates what took
// effect, like any step past the deadline, and an event arriving after
// that is refused as the saga has ended.
func TestAwaitDeadlinePassesWhileWaiting(t *testing.T) {
	t.Parallel()
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock})
	wait := saga.Await[payment]{Event: "payment.confirmed", OnEvent: func(*payment, json.RawMessage) error { return nil }}
	spec := paymentSpec(b, wait)
	spec.Deadline = time.Hour
	def := mustDefine(t, spec)
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
	startPayment(t, d, def, "late")
	d.reply("late", d.last("late"), core.OutcomeSuccess)
	if in := d.get("late"); in.Step != "paid" || in.Status != saga.StatusRunning {
		t.Fatalf("not waiting: %s at %s", in.Status, in.Step)
	}
	clock.Advance(2 * time.Hour)
	if _, err := d.o.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	in := d.get("late")
	if in.Status != saga.StatusCompensating {
		t.Fatalf("past the deadline while waiting: %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if c := d.last("late"); c.Step != "reserve" || c.Op != core.OperationCompensation {
		t.Fatalf("last command %+v, want reserve's compensation", c)
	}
	d.reply("late", d.last("late"), core.OutcomeSuccess)
	if in := d.get("late"); in.Status != saga.StatusCompensated {
		t.Fatalf("after the compensation's reply: %s", in.Status)
	}
	err := saga.Signal(context.Background(), d.o, "late", "payment.confirmed", "psp-late", confirmation{Ref: "r"})
	if !errors.Is(err, saga.ErrSagaEnded) {
		t.Fatalf("an event after the end: %v, want ErrSagaEnded", err)
	}
}
