package sagatest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// shippingDef is a child saga of two remote compensatable steps.
var shippingDef = func() *saga.Definition[order] {
	def, err := saga.Define(saga.Spec[order]{Type: "shipping", Version: 1, Steps: []saga.Step[order]{
		{Name: "pack", Kind: saga.Compensatable, Timeout: 30 * time.Second,
			Action: &saga.Command[order]{Topic: "pack"}, Compensation: &saga.Command[order]{}},
		{Name: "send", Kind: saga.Compensatable, Timeout: 30 * time.Second,
			Action: &saga.Command[order]{Topic: "send"}, Compensation: &saga.Command[order]{}},
	}})
	if err != nil {
		panic(err)
	}
	return def
}()

// familyDef: credit; gift, only for amounts over 50 (When); shipping, a
// child saga; stock, which refuses amounts over 100: all compensatable.
var familyDef = func() *saga.Definition[order] {
	def, err := saga.Define(saga.Spec[order]{Type: "family", Version: 1, Steps: []saga.Step[order]{
		{Name: "credit", Kind: saga.Compensatable, Timeout: 30 * time.Second,
			Action: &saga.Command[order]{Topic: "credit"}, Compensation: &saga.Command[order]{}},
		{Name: "gift", Kind: saga.Compensatable, Timeout: 30 * time.Second, When: func(o order) bool { return o.Amount > 50 },
			Action: &saga.Command[order]{Topic: "gift"}, Compensation: &saga.Command[order]{}},
		{Name: "shipping", Kind: saga.Compensatable, Child: &saga.Child[order]{Definition: shippingDef}},
		{Name: "stock", Kind: saga.Compensatable, Timeout: time.Minute,
			Action: &saga.Command[order]{Topic: "stock"}, Compensation: &saga.Command[order]{}},
	}})
	if err != nil {
		panic(err)
	}
	return def
}()

// familyScenario starts one order per amount: 10 skips the gift, 80 runs
// it, 500 runs it and is refused by stock, so its parent compensates its
// completed child.
func familyScenario(h *sagatest.H) error {
	if _, err := h.Pool().Exec(h.Context(), fmt.Sprintf(ledgerDDL, h.Table("ledger"))); err != nil {
		return err
	}
	for _, name := range []string{"credit", "gift", "pack", "send", "stock"} {
		p, err := h.NewParticipant(name)
		if err != nil {
			return err
		}
		err = compensation.Register(p, name, func(ctx context.Context, tx pgx.Tx, call compensation.Call, l line) (map[string]string, error) {
			if name == "stock" && l.Amount > 100 {
				return nil, compensation.Fail("out of stock")
			}
			return nil, record(ctx, tx, h, call, +1)
		}, func(ctx context.Context, tx pgx.Tx, call compensation.Call, _ line) error {
			return record(ctx, tx, h, call, -1)
		})
		if err != nil {
			return err
		}
		if err := h.AddParticipant(p, name); err != nil {
			return err
		}
	}
	if err := h.Register(familyDef); err != nil { // and its child's
		return err
	}
	for i, amount := range []int{10, 80, 500} {
		id := "f" + strconv.Itoa(i+1)
		if _, err := saga.Start(h.Context(), h.Orchestrator(), familyDef, id, order{ID: id, Amount: amount}); err != nil {
			return err
		}
	}
	return nil
}

// familyCheck: the gift ran if and only if the amount is over 50; a
// parent that ended has its child ended the same way (or never started).
func familyCheck(ctx context.Context, h *sagatest.H, in *saga.Instance) error {
	if in.Parent != "" {
		return nil // checked with its parent
	}
	var o struct{ Amount int }
	if err := json.Unmarshal(in.Data, &o); err != nil {
		return err
	}
	if st := in.Steps["gift"]; st != nil && (st.Status == saga.StepSkipped) != (o.Amount <= 50) {
		return fmt.Errorf("amount %d, gift %q", o.Amount, st.Status)
	}
	res, err := h.Orchestrator().List(ctx, saga.ListParams{Parent: in.ID})
	if err != nil {
		return err
	}
	if len(res.Sagas) > 1 {
		return fmt.Errorf("%d children, want at most 1", len(res.Sagas))
	}
	if in.Status != saga.StatusCompleted && in.Status != saga.StatusCompensated {
		return nil
	}
	if len(res.Sagas) == 0 {
		if in.Status == saga.StatusCompleted {
			return fmt.Errorf("completed without its child")
		}
		return nil
	}
	if c := res.Sagas[0]; c.Status != in.Status {
		return fmt.Errorf("the parent is %s, its child %s is %s", in.Status, c.ID, c.Status)
	}
	return nil
}

func familyEffects(ctx context.Context, h *sagatest.H, id string) (map[string]int, error) {
	m, err := effects(ctx, h, id)
	delete(m, "ship")
	return m, err
}

// Conditional steps, true and false, and a child saga that completes or
// is compensated through its parent, under every single fault at every
// delivery, timer and event (a crash while the parent starts its child or
// applies its end among them), then random ones.
func TestConditionsAndChildSagasExplored(t *testing.T) {
	t.Parallel()
	cfg := sagatest.Config{Effects: familyEffects, Check: familyCheck}
	sagatest.Explore(t, sagatest.ExploreConfig{Config: cfg, Enumerate: true, Runs: 10, Seed: 11}, familyScenario)
}

func TestConditionsAndChildSagasWithoutFaults(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, sagatest.Config{Effects: familyEffects, Check: familyCheck})
	if err := familyScenario(h); err != nil {
		t.Fatal(err)
	}
	h.Run(t)
	for id, want := range map[string]saga.Status{"f1": saga.StatusCompleted, "f2": saga.StatusCompleted, "f3": saga.StatusCompensated,
		"f1/shipping/1": saga.StatusCompleted, "f3/shipping/1": saga.StatusCompensated} {
		in, err := h.Get(id)
		if err != nil || in.Status != want {
			t.Fatalf("%s: %v %+v, want %s", id, err, in, want)
		}
	}
}
