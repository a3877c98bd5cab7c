package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// checkout is the keyed tests' data: a payment id (a unique key), a batch
// (a shared key), and search attributes.
type checkout struct {
	ID        string    `json:"id"`
	PaymentID string    `json:"payment_id"`
	Batch     string    `json:"batch,omitempty"`
	Customer  string    `json:"customer"`
	Amount    float64   `json:"amount"`
	Due       time.Time `json:"due,omitzero"`
	Got       []string  `json:"got,omitempty"`
	Ref       string    `json:"ref,omitempty"`
}

// checkoutSpec: reserve (remote), wait for the payment, ship (local pivot).
func checkoutSpec() saga.Spec[checkout] {
	return saga.Spec[checkout]{
		Type: "order", Version: 1,
		Steps: []saga.Step[checkout]{
			{Name: "reserve", Kind: saga.Compensatable, Action: &saga.Command[checkout]{Topic: "stock"},
				Compensation: &saga.Command[checkout]{}, Timeout: time.Hour},
			{Name: "paid", Kind: saga.Compensatable, Await: &saga.Await[checkout]{Event: "payment.confirmed",
				OnEvent: saga.EventFunc(func(c *checkout, e confirmation) error {
					c.Got, c.Ref = append(c.Got, e.Ref), e.Ref
					return nil
				})}},
			{Name: "ship", Kind: saga.Pivot, Local: func(context.Context, pgx.Tx, *checkout) error { return nil }},
		},
		Keys: []saga.Key[checkout]{
			{Name: "payment_id", Unique: true, Value: func(c checkout) string { return c.PaymentID }},
			{Name: "batch", Value: func(c checkout) string { return c.Batch }},
		},
		Attributes: []saga.Attr[checkout]{
			{Name: "customer", Text: func(c checkout) string { return c.Customer }},
			{Name: "amount", Number: func(c checkout) float64 { return c.Amount }},
			{Name: "due", Time: func(c checkout) time.Time { return c.Due }},
			{Name: "ref", Text: func(c checkout) string { return c.Ref }},
		},
	}
}

func setupKeyed(t *testing.T) (*driver, *saga.Definition[checkout]) {
	t.Helper()
	def := mustDefine(t, checkoutSpec())
	return setupDriver(t, func(*testBundle) []saga.Registrable { return []saga.Registrable{def} }), def
}

func startCheckout(t *testing.T, d *driver, def *saga.Definition[checkout], c checkout) {
	t.Helper()
	if _, err := saga.Start(context.Background(), d.o, def, c.ID, c); err != nil {
		t.Fatal(err)
	}
}

// attrs returns a saga's saga_attr rows as "name=value live" (value,
// num or at, whichever is set).
func (d *driver) attrs(id string) []string {
	d.t.Helper()
	return d.texts(`SELECT name || '=' || coalesce(value, num::text, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD'), '') || ' ' || kind || ' ' || live
  FROM `+d.tbl("saga_attr")+` WHERE saga_id = $1 ORDER BY name`, id)
}

// keyedEvents returns the stored events sent by key, as
// "saga_id:name/state key_name=key_value", in order of arrival.
func (d *driver) keyedEvents() []string {
	d.t.Helper()
	return d.texts(`SELECT saga_id || ':' || name || '/' || state || ' ' || key_type || '.' || key_name || '=' || key_value
  FROM ` + d.tbl("saga_event") + ` WHERE key_name <> '' ORDER BY arrived`)
}

// texts returns the one text column of a query's rows.
func (d *driver) texts(sql string, args ...any) []string {
	d.t.Helper()
	rows, err := d.db.Pool.Query(context.Background(), sql, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// A keyed signal before the wait is stored and applied when the saga
// gets there; a repeated delivery applies once; after the saga ended the
// key is no longer held: a new event is refused with ErrKeyNotHeld and
// recorded with an empty saga id and its key, and a late repeat of the
// event the saga took is still nil. The keys and attributes follow the
// data and are released at the end.
func TestSignalByKeyEarlyDuplicatedAndAfterTheEnd(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	due := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	startCheckout(t, d, def, checkout{ID: "k-1", PaymentID: "pi_1", Customer: "ada", Amount: 120.5, Due: due})
	want := []string{"amount=120.5 number true", "batch= key true", "customer=ada text true", "due=2026-02-01 time true",
		"payment_id=pi_1 unique_key true", "ref= text true"}
	if got := d.attrs("k-1"); !slices.Equal(got, want) {
		t.Fatalf("attributes at start %q, want %q", got, want)
	}
	wantGet := map[string]string{"amount": "120.5", "customer": "ada", "due": "2026-02-01T00:00:00Z", "payment_id": "pi_1"}
	if got := d.get("k-1").Attributes; !maps.Equal(got, wantGet) {
		t.Fatalf("Get's Attributes %v, want %v", got, wantGet)
	}
	for range 2 {
		if err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "pi_1", "payment.confirmed", "psp-1", confirmation{Ref: "r1"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := d.eventStates("k-1"); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
		t.Fatalf("events before the wait %v", got)
	}
	d.reply("k-1", d.last("k-1"), core.OutcomeSuccess)
	in := d.get("k-1")
	var c checkout
	if err := json.Unmarshal(in.Data, &c); err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompleted || !slices.Equal(c.Got, []string{"r1"}) {
		t.Fatalf("status %s, events applied %v", in.Status, c.Got)
	}
	want = []string{"amount=120.5 number false", "batch= key false", "customer=ada text false", "due=2026-02-01 time false",
		"payment_id=pi_1 unique_key false", "ref=r1 text false"}
	if got := d.attrs("k-1"); !slices.Equal(got, want) {
		t.Fatalf("attributes at the end %q, want %q", got, want)
	}
	if err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "pi_1", "payment.confirmed", "psp-1", confirmation{Ref: "r1"}); err != nil {
		t.Fatalf("a repeat of the event the saga took, after its end: %v", err)
	}
	err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "pi_1", "payment.confirmed", "psp-2", confirmation{Ref: "late"})
	if !errors.Is(err, saga.ErrKeyNotHeld) || !strings.Contains(err.Error(), "pi_1") {
		t.Fatalf("after the end: %v, want ErrKeyNotHeld naming the value", err)
	}
	want = []string{"k-1:payment.confirmed/consumed order.payment_id=pi_1", ":payment.confirmed/refused order.payment_id=pi_1"}
	if got := d.keyedEvents(); !slices.Equal(got, want) {
		t.Fatalf("keyed events %q, want %q", got, want)
	}
	if err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "", "payment.confirmed", "psp-3", nil); !errors.Is(err, saga.ErrInvalidEvent) {
		t.Fatalf("empty key value: %v", err)
	}
}

// A unique key held by a running saga refuses a second start with
// ErrKeyTaken before anything is written (the caller's transaction goes
// on); once the first saga ended, the value is free.
func TestStartRefusesAUniqueKeyTaken(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	startCheckout(t, d, def, checkout{ID: "k-2", PaymentID: "pi_2"})
	tx, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = saga.StartTx(ctx, tx, d.o, def, "k-3", checkout{ID: "k-3", PaymentID: "pi_2"})
	if !errors.Is(err, saga.ErrKeyTaken) || !strings.Contains(err.Error(), `"k-2"`) {
		t.Fatalf("second start: %v, want ErrKeyTaken naming k-2", err)
	}
	if _, err := saga.StartTx(ctx, tx, d.o, def, "k-4", checkout{ID: "k-4", PaymentID: "pi_4"}); err != nil {
		t.Fatalf("the transaction is usable after the refusal: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.o.Get(ctx, "k-3"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("the refused saga: %v", err)
	}
	// A repeated start of the holder is not a conflict with itself.
	if in, err := saga.Start(ctx, d.o, def, "k-2", checkout{ID: "k-2", PaymentID: "pi_2"}); err != nil || !in.Existing {
		t.Fatalf("repeated start: %v", err)
	}
	d.reply("k-2", d.last("k-2"), core.OutcomeFailure) // compensates: reserve failed, nothing to undo
	if in := d.get("k-2"); in.Status != saga.StatusCompensated {
		t.Fatalf("k-2 is %s", in.Status)
	}
	startCheckout(t, d, def, checkout{ID: "k-3", PaymentID: "pi_2"})
}

// A shared key held by two running sagas delivers the event to both.
func TestSignalByKeySharedKeyReachesEverySaga(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	for _, id := range []string{"k-5", "k-6"} {
		startCheckout(t, d, def, checkout{ID: id, PaymentID: "pi-" + id, Batch: "b-1"})
		d.reply(id, d.last(id), core.OutcomeSuccess) // waiting
	}
	startCheckout(t, d, def, checkout{ID: "k-7", PaymentID: "pi-k-7", Batch: "b-2"})
	if err := saga.SignalByKey(ctx, d.o, "order", "batch", "b-1", "payment.confirmed", "batch-paid", confirmation{Ref: "b"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"k-5", "k-6"} {
		if in := d.get(id); in.Status != saga.StatusCompleted {
			t.Fatalf("%s is %s at %s", id, in.Status, in.Step)
		}
	}
	if got := d.eventStates("k-7"); len(got) != 0 {
		t.Fatalf("k-7 (another batch) got %v", got)
	}
	// Both ended: the next event for the batch is refused.
	err := saga.SignalByKey(ctx, d.o, "order", "batch", "b-1", "payment.confirmed", "batch-late", nil)
	if !errors.Is(err, saga.ErrKeyNotHeld) {
		t.Fatalf("after both ended: %v", err)
	}
}

// An EventHandler route may address the event by key; no saga holding it
// is a refusal, recorded and acknowledged.
func TestEventHandlerRoutesByKey(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	startCheckout(t, d, def, checkout{ID: "k-8", PaymentID: "pi_8"})
	d.reply("k-8", d.last("k-8"), core.OutcomeSuccess)
	h := d.o.EventHandler(func(msg *message.Message) (saga.EventTarget, error) {
		return saga.EventTarget{Type: "order", Key: "payment_id", Value: msg.Metadata.Get("payment_id"),
			Event: "payment.confirmed", EventID: msg.Metadata.Get("psp_event")}, nil
	})
	for _, m := range []struct{ pid, ev string }{{"pi_8", "e-1"}, {"pi_8", "e-1"}, {"pi_unknown", "e-2"}} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"ref":"h"}`))
		msg.Metadata.Set("payment_id", m.pid)
		msg.Metadata.Set("psp_event", m.ev)
		if err := h(msg); err != nil {
			t.Fatalf("%s: %v", m.pid, err)
		}
	}
	in := d.get("k-8")
	if in.Status != saga.StatusCompleted {
		t.Fatalf("k-8 is %s", in.Status)
	}
	want := []string{"k-8:payment.confirmed/consumed order.payment_id=pi_8", ":payment.confirmed/refused order.payment_id=pi_unknown"}
	if got := d.keyedEvents(); !slices.Equal(got, want) {
		t.Fatalf("keyed events %q, want %q", got, want)
	}
}

// Define refuses keys and attributes it cannot use.
func TestDefineRefusesBadKeysAndAttributes(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*saga.Spec[checkout]){
		"duplicate name": func(s *saga.Spec[checkout]) {
			s.Attributes = append(s.Attributes, saga.Attr[checkout]{Name: "batch", Text: func(checkout) string { return "" }})
		},
		"no value":   func(s *saga.Spec[checkout]) { s.Keys[0].Value = nil },
		"two kinds":  func(s *saga.Spec[checkout]) { s.Attributes[0].Number = func(checkout) float64 { return 0 } },
		"empty name": func(s *saga.Spec[checkout]) { s.Keys[1].Name = "" },
	} {
		spec := checkoutSpec()
		mod(&spec)
		if _, err := saga.Define(spec); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}

// listIDs returns the ids List gives for the attribute filters.
func listIDs(t *testing.T, o *saga.Orchestrator, attrs ...string) []string {
	t.Helper()
	res, err := o.List(context.Background(), saga.ListParams{Attrs: attrs})
	if err != nil {
		t.Fatalf("List %q: %v", attrs, err)
	}
	var ids []string
	for _, in := range res.Sagas {
		ids = append(ids, in.ID)
	}
	return ids
}

// List filters by keys and attributes: equality on a key or a text,
// comparisons on a number and a time, several filters together; a filter
// it cannot read is refused with core.ErrInvalidListParams. A bulk retry
// by the same filters acts on Ada's stuck orders only.
func TestListAndBulkFilterByAttributes(t *testing.T) {
	t.Parallel()
	spec := checkoutSpec()
	spec.Steps[0].OnTimeout = saga.TimeoutStuck
	def := mustDefine(t, spec)
	d := setupDriver(t, func(*testBundle) []saga.Registrable { return []saga.Registrable{def} })
	ctx := context.Background()
	for _, c := range []checkout{
		{ID: "ada-1", PaymentID: "pi-1", Customer: "ada", Amount: 120, Due: time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "ada-2", PaymentID: "pi-2", Customer: "ada", Amount: 50, Due: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)},
		{ID: "bob-1", PaymentID: "pi-3", Customer: "bob", Amount: 300},
	} {
		startCheckout(t, d, def, c)
	}
	for filters, want := range map[string][]string{
		"customer=ada":              {"ada-2", "ada-1"},
		"customer = bob":            {"bob-1"},
		"payment_id=pi-1":           {"ada-1"},
		"amount>100":                {"bob-1", "ada-1"},
		"amount>=50,customer=ada":   {"ada-2", "ada-1"},
		"amount<=50":                {"ada-2"},
		"amount=300":                {"bob-1"},
		"due<2026-02-15":            {"ada-1"},
		"due>=2026-03-01T00:00:00Z": {"ada-2"},
		"customer=carol":            nil,
	} {
		if got := listIDs(t, d.o, strings.Split(filters, ",")...); !slices.Equal(got, want) {
			t.Errorf("List %s: %v, want %v", filters, got, want)
		}
	}
	for _, bad := range []string{"amount>abc", "customer", "=ada", "customer=", "customer<ada"} {
		if _, err := d.o.List(ctx, saga.ListParams{Attrs: []string{bad}}); !errors.Is(err, core.ErrInvalidListParams) {
			t.Errorf("List %q: %v, want ErrInvalidListParams", bad, err)
		}
	}
	if _, err := d.o.DryRun(ctx, saga.Query{Attrs: []string{"amount>abc"}}, 5); !errors.Is(err, saga.ErrInvalidQuery) {
		t.Errorf("DryRun with a bad filter: %v, want ErrInvalidQuery", err)
	}

	// Every step times out: all three are stuck; retry Ada's.
	d.tick(2 * time.Hour)
	q := saga.Query{Status: saga.StatusStuck, Attrs: []string{"customer=ada"}}
	dry, err := d.o.DryRun(ctx, q, 10)
	if err != nil || dry.Count != 2 {
		t.Fatalf("dry run of Ada's stuck orders: %+v, %v", dry, err)
	}
	b, err := d.o.Bulk(ctx, saga.ActionRetry, q, saga.Actor{Operator: "alice", Reason: "stock fixed"})
	if err != nil {
		t.Fatal(err)
	}
	if b = drain(t, d.o, d.o, b.ID); b.Counts.Applied != 2 {
		t.Fatalf("bulk retry: %+v", b.Counts)
	}
	for id, want := range map[string]saga.Status{"ada-1": saga.StatusRunning, "ada-2": saga.StatusRunning, "bob-1": saga.StatusStuck} {
		if in := d.get(id); in.Status != want {
			t.Errorf("%s is %s, want %s", id, in.Status, want)
		}
	}
}

// Two starts racing for one unique key (the second's check runs before
// the first commits): the second waits on the unique index and is refused
// with ErrKeyTaken when the first commits.
func TestConcurrentStartsOfAUniqueKeyOneWins(t *testing.T) {
	t.Parallel()
	d, def := setupKeyed(t)
	ctx := context.Background()
	first, err := d.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if _, err := saga.StartTx(ctx, first, d.o, def, "race-1", checkout{ID: "race-1", PaymentID: "pi_race"}); err != nil {
		t.Fatal(err)
	}
	second := make(chan error, 1)
	go func() {
		_, err := saga.Start(ctx, d.o, def, "race-2", checkout{ID: "race-2", PaymentID: "pi_race"})
		second <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		if err := d.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%saga_attr%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second start never waited for the first")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-second; !errors.Is(err, saga.ErrKeyTaken) {
		t.Fatalf("second start: %v, want ErrKeyTaken", err)
	}
	if _, err := d.o.Get(ctx, "race-2"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("the refused start left its saga: %v", err)
	}
}

// A unique key's value that changes while the saga runs to one another
// running saga holds is not taken (the saga keeps its own), and the saga
// goes on: the save never fails on it. A scheduled saga holds its keys.
func TestUniqueKeyChangedToATakenValueIsNotTaken(t *testing.T) {
	t.Parallel()
	spec := checkoutSpec()
	spec.Steps[1].Await.OnEvent = saga.EventFunc(func(c *checkout, e confirmation) error {
		c.PaymentID, c.Ref = e.Ref, e.Ref // the provider moved the charge
		return nil
	})
	spec.Steps[2] = saga.Step[checkout]{Name: "ship", Kind: saga.Pivot, Action: &saga.Command[checkout]{Topic: "shipping"}, Timeout: time.Hour}
	def := mustDefine(t, spec)
	d := setupDriver(t, func(*testBundle) []saga.Registrable { return []saga.Registrable{def} })
	ctx := context.Background()
	startCheckout(t, d, def, checkout{ID: "u-1", PaymentID: "pi_a"})
	startCheckout(t, d, def, checkout{ID: "u-2", PaymentID: "pi_b"})
	d.reply("u-2", d.last("u-2"), core.OutcomeSuccess)
	if err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "pi_b", "payment.confirmed", "e-1", confirmation{Ref: "pi_a"}); err != nil {
		t.Fatal(err)
	}
	if in := d.get("u-2"); in.Status != saga.StatusRunning || in.Step != "ship" {
		t.Fatalf("u-2 is %s at %s (%s)", in.Status, in.Step, in.LastError)
	}
	if got := d.attrs("u-2"); !slices.Contains(got, "payment_id=pi_b unique_key true") {
		t.Fatalf("u-2's attributes %q: want its own payment id kept", got)
	}
	if got := d.attrs("u-1"); !slices.Contains(got, "payment_id=pi_a unique_key true") {
		t.Fatalf("u-1's attributes %q", got)
	}

	later := d.clock.Now().Add(time.Hour)
	if _, err := saga.Start(ctx, d.o, def, "u-3", checkout{ID: "u-3", PaymentID: "pi_c"}, saga.StartAt(later)); err != nil {
		t.Fatal(err)
	}
	if _, err := saga.Start(ctx, d.o, def, "u-4", checkout{ID: "u-4", PaymentID: "pi_c"}); !errors.Is(err, saga.ErrKeyTaken) {
		t.Fatalf("a key a scheduled saga holds: %v, want ErrKeyTaken", err)
	}
}

// Migrate to a version that declares other keys and attributes: the
// saga's are recomputed, and those v2 no longer declares are dropped (a
// dropped key is not held).
func TestMigrateRecomputesKeysAndAttributes(t *testing.T) {
	t.Parallel()
	d, v1 := setupKeyed(t)
	ctx := context.Background()
	startCheckout(t, d, v1, checkout{ID: "m-1", PaymentID: "pi_m", Batch: "b-m", Customer: "ada"})
	spec := checkoutSpec()
	spec.Version = 2
	spec.Keys = spec.Keys[:1] // batch dropped
	spec.Attributes = []saga.Attr[checkout]{{Name: "customer", Text: func(c checkout) string { return c.Customer }},
		{Name: "tier", Text: func(c checkout) string { return "gold" }}}
	v2 := mustDefine(t, spec)
	if err := d.o.Register(v2); err != nil {
		t.Fatal(err)
	}
	if n, err := saga.Migrate(ctx, d.o, saga.Migration[checkout, checkout]{From: v1, To: v2, Operator: "alice", Reason: "v2"}); n != 1 || err != nil {
		t.Fatalf("migrated %d: %v", n, err)
	}
	want := []string{"customer=ada text true", "payment_id=pi_m unique_key true", "tier=gold text true"}
	if got := d.attrs("m-1"); !slices.Equal(got, want) {
		t.Fatalf("attributes after the migration %q, want %q", got, want)
	}
	if err := saga.SignalByKey(ctx, d.o, "order", "batch", "b-m", "payment.confirmed", "e-1", nil); !errors.Is(err, saga.ErrKeyNotHeld) {
		t.Fatalf("by the dropped key: %v", err)
	}
}

// An attribute function that panics on the data a step left: the saga
// goes on, its attributes as they were (the failure is logged) and its
// keys released when it ends; at the start it refuses the start.
func TestAttributeFunctionPanics(t *testing.T) {
	t.Parallel()
	spec := checkoutSpec()
	spec.Attributes = append(spec.Attributes, saga.Attr[checkout]{Name: "fragile", Text: func(c checkout) string {
		if c.Ref == "boom" || c.Customer == "boom" {
			panic("boom")
		}
		return c.Ref
	}})
	def := mustDefine(t, spec)
	d := setupDriver(t, func(*testBundle) []saga.Registrable { return []saga.Registrable{def} })
	ctx := context.Background()
	if _, err := saga.Start(ctx, d.o, def, "f-0", checkout{ID: "f-0", Customer: "boom"}); !errors.Is(err, saga.ErrPanic) {
		t.Fatalf("start with data the function panics on: %v, want ErrPanic", err)
	}
	startCheckout(t, d, def, checkout{ID: "f-1", PaymentID: "pi_f", Customer: "ada"})
	d.reply("f-1", d.last("f-1"), core.OutcomeSuccess)
	if err := saga.SignalByKey(ctx, d.o, "order", "payment_id", "pi_f", "payment.confirmed", "e-1", confirmation{Ref: "boom"}); err != nil {
		t.Fatal(err)
	}
	if in := d.get("f-1"); in.Status != saga.StatusCompleted {
		t.Fatalf("f-1 is %s (%s)", in.Status, in.LastError)
	}
	if got := d.attrs("f-1"); !slices.Contains(got, "payment_id=pi_f unique_key false") || !slices.Contains(got, "fragile= text false") {
		t.Fatalf("attributes %q: want them as they were at the start, released at the end", got)
	}
	startCheckout(t, d, def, checkout{ID: "f-2", PaymentID: "pi_f"}) // the unique key is free
}
