package sagatest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// paidDef: credit (remote), then a wait for the payment provider's
// confirmation or decline (10 minutes, then compensate), approve (local
// pivot), ship (retriable).
var paidDef = func() *saga.Definition[order] {
	def, err := saga.Define(saga.Spec[order]{Type: "paid-order", Version: 1, Steps: paidSteps()})
	if err != nil {
		panic(err)
	}
	return def
}()

// paidSteps are paidDef's steps.
func paidSteps() []saga.Step[order] {
	payload := func(o order) (any, error) { return line{Order: o.ID, Amount: o.Amount}, nil }
	return []saga.Step[order]{
		{Name: "credit", Kind: saga.Compensatable, Timeout: 30 * time.Second,
			Action:       &saga.Command[order]{Topic: "credit", Payload: payload},
			Compensation: &saga.Command[order]{}},
		{Name: "paid", Kind: saga.Compensatable, Await: &saga.Await[order]{
			Any: []string{"payment.confirmed", "payment.declined"}, Timeout: 10 * time.Minute, OnTimeout: saga.TimeoutCompensate,
			On: map[string]func(*order, json.RawMessage) error{
				"payment.declined": func(*order, json.RawMessage) error { return saga.Fail("declined") },
			}}},
		{Name: "approve", Kind: saga.Pivot,
			Local: func(_ context.Context, _ pgx.Tx, o *order) error { o.Approved = true; return nil }},
		{Name: "ship", Kind: saga.Retriable, Timeout: time.Hour, Retry: saga.RetryPolicy{MaxAttempts: 10},
			Action: &saga.Command[order]{Topic: "ship", Payload: payload}},
	}
}

// paidScenario: p1's confirmation is sent at once (it arrives before the
// saga waits for it), and again by a retrying provider (same id); p2 gets
// a decline and a confirmation, racing; p3 gets nothing and times out.
func paidScenario(h *sagatest.H) error {
	if err := participants(h, "stock"); err != nil {
		return err
	}
	if err := h.Register(paidDef); err != nil {
		return err
	}
	h.AddEvents("psp.webhooks", nil)
	for _, id := range []string{"p1", "p2", "p3"} {
		if _, err := saga.Start(h.Context(), h.Orchestrator(), paidDef, id, order{ID: id, Amount: 10}); err != nil {
			return err
		}
	}
	for _, e := range []struct{ saga, name, id string }{
		{"p1", "payment.confirmed", "psp-1"}, {"p1", "payment.confirmed", "psp-1"},
		{"p2", "payment.declined", "psp-2a"}, {"p2", "payment.confirmed", "psp-2b"},
	} {
		if err := h.SendEvent("psp.webhooks", e.saga, e.name, e.id, map[string]string{"ref": e.id}); err != nil {
			return err
		}
	}
	return nil
}

// paidCheck: a saga completed if and only if it consumed a confirmation,
// and it consumed at most one event.
func paidCheck(ctx context.Context, h *sagatest.H, in *saga.Instance) error {
	rows, err := h.Pool().Query(ctx, fmt.Sprintf(`SELECT name FROM %s WHERE saga_id = $1 AND state = 'consumed' ORDER BY arrived`, h.Table("saga_event")), in.ID)
	if err != nil {
		return err
	}
	consumed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	confirmed := slices.Equal(consumed, []string{"payment.confirmed"})
	switch {
	case len(consumed) > 1:
		return fmt.Errorf("consumed %v: an any-of wait takes one", consumed)
	case in.Status == saga.StatusCompleted && !confirmed:
		return fmt.Errorf("completed, consumed %v", consumed)
	case in.Status == saga.StatusCompensated && confirmed:
		return fmt.Errorf("compensated after a confirmation was consumed")
	case in.ID == "p3" && in.Status != saga.StatusCompensated:
		return fmt.Errorf("p3 got no event and is %s", in.Status)
	}
	return nil
}

func paidEffects(ctx context.Context, h *sagatest.H, id string) (map[string]int, error) {
	m, err := effects(ctx, h, id)
	delete(m, "stock")
	return m, err
}

// Waits under every single fault at every delivery, timer and event
// (duplicated, delayed past the timeout, reordered, a crash while one is
// applied), then random combinations.
func TestWaitStepsExplored(t *testing.T) {
	t.Parallel()
	cfg := sagatest.Config{Effects: paidEffects, Check: paidCheck}
	sagatest.Explore(t, sagatest.ExploreConfig{Config: cfg, Enumerate: true, Runs: 20, Seed: 7}, paidScenario)
}

// An event after the end is refused and recorded; one sent early is
// consumed when the saga waits.
func TestSignalEarlyAndAfterTheEnd(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, sagatest.Config{Effects: paidEffects, Check: paidCheck})
	if err := paidScenario(h); err != nil {
		t.Fatal(err)
	}
	h.Run(t)
	in, err := h.Get("p1")
	if err != nil || in.Status != saga.StatusCompleted {
		t.Fatalf("p1: %v %+v", err, in)
	}
	if err := h.Signal("p1", "payment.confirmed", "psp-late", nil); !errors.Is(err, saga.ErrSagaEnded) {
		t.Fatalf("after the end: %v", err)
	}
	hist, err := h.History("p1")
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []string
	for _, e := range hist {
		if e.Event == "event" {
			outcomes = append(outcomes, e.Outcome)
		}
	}
	if !slices.Equal(outcomes, []string{"pending", "consumed", "refused"}) {
		t.Fatalf("p1's events in its history: %v", outcomes)
	}
}
