package saga_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/saga"
)

// orderSpec is a three-step saga: reserve credit (remote), approve (local),
// reserve stock (remote), all compensatable.
func orderSpec(b *testBundle, version int) saga.Spec[order] {
	return saga.Spec[order]{
		Type:    "order",
		Version: version,
		Steps: []saga.Step[order]{
			{
				Name: "credit", Kind: saga.Compensatable,
				Action: &saga.Command[order]{Topic: "credit", Payload: func(o order) (any, error) {
					return map[string]any{"order": o.ID, "amount": o.Amount}, nil
				}},
				OnSuccess: saga.Reply(func(o *order, r struct {
					Tx string `json:"tx"`
				}) error {
					o.CreditTx = r.Tx
					return nil
				}),
				Compensation: &saga.Command[order]{Topic: "credit", Name: "release-credit"},
				Timeout:      time.Second,
			},
			{
				Name: "approve", Kind: saga.Compensatable,
				Local: func(ctx context.Context, tx pgx.Tx, o *order) error {
					o.Approved = true
					_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, what) VALUES ($1, 'approve', 'do')`, b.tbl("test_effect")), o.ID)
					return err
				},
				LocalCompensation: func(ctx context.Context, tx pgx.Tx, o *order) error {
					o.Approved = false
					_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, what) VALUES ($1, 'approve', 'undo')`, b.tbl("test_effect")), o.ID)
					return err
				},
			},
			{
				Name: "stock", Kind: saga.Compensatable,
				Action:       &saga.Command[order]{Topic: "stock"},
				Compensation: &saga.Command[order]{Topic: "stock", Name: "return-stock"},
				Timeout:      time.Second,
			},
		},
	}
}

func mustDefine[D any](t testing.TB, spec saga.Spec[D]) *saga.Definition[D] {
	t.Helper()
	d, err := saga.Define(spec)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func start(t testing.TB, b *testBundle, def *saga.Definition[order], id string, amount int) *saga.Instance {
	t.Helper()
	in, err := saga.Start(context.Background(), b.o, def, id, order{ID: id, Amount: amount})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func events(t testing.TB, b *testBundle, id string) []string {
	t.Helper()
	h, err := b.o.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range h {
		s := e.Event
		if e.Step != "" {
			s += ":" + e.Step
		}
		out = append(out, s)
	}
	return out
}

func TestHappyPath(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, false)
	def := mustDefine(t, e.spec(1, 10*time.Second))
	e.start(t, def)

	start(t, e.testBundle, def, "o-1", 10)
	in := e.waitStatus("o-1", saga.StatusCompleted)
	if got := e.effects("o-1"); !slices.Equal(got, []string{"credit:do", "approve:do", "stock:do"}) {
		t.Fatalf("effects %v", got)
	}
	if got := dataOf(t, in); got != (order{ID: "o-1", Amount: 10, Approved: true, CreditTx: "credit-o-1"}) {
		t.Fatalf("data %s", in.Data)
	}
	if in.EndedAt == nil || in.NextWakeupAt != nil || in.Step != "" {
		t.Fatalf("ended saga: %+v", in)
	}
	h := events(t, e.testBundle, "o-1")
	want := []string{"started", "command:credit", "reply:credit", "step_done:credit", "step_done:approve", "command:stock", "reply:stock", "step_done:stock", "completed"}
	if !slices.Equal(h, want) {
		t.Fatalf("history\n got %v\nwant %v", h, want)
	}
}

func TestFailureCompensatesInReverse(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, false)
	e.failStock = func(string) bool { return true }
	def := mustDefine(t, e.spec(1, 10*time.Second))
	e.start(t, def)

	start(t, e.testBundle, def, "o-2", 10)
	in := e.waitStatus("o-2", saga.StatusCompensated)
	if got := e.effects("o-2"); !slices.Equal(got, []string{"credit:do", "approve:do", "approve:undo", "credit:undo"}) {
		t.Fatalf("effects %v", got)
	}
	if in.LastError != "step stock failed: failure: out of stock" {
		t.Fatalf("last error %q", in.LastError)
	}
	if in.Steps["stock"].Status != saga.StepFailed || in.Steps["credit"].Status != saga.StepCompensated || in.Steps["approve"].Status != saga.StepCompensated {
		t.Fatalf("steps %+v %+v %+v", in.Steps["credit"], in.Steps["approve"], in.Steps["stock"])
	}
}

func dataOf(t testing.TB, in *saga.Instance) order {
	t.Helper()
	var o order
	if err := json.Unmarshal(in.Data, &o); err != nil {
		t.Fatal(err)
	}
	return o
}
