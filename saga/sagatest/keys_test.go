package sagatest_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// keyedDef is paidDef whose events find their saga by the provider's
// payment id ("pi-" and the order id), a unique correlation key.
var keyedDef = func() *saga.Definition[order] {
	spec := saga.Spec[order]{Type: "keyed-order", Version: 1, Steps: paidSteps(),
		Keys: []saga.Key[order]{{Name: "payment_id", Unique: true, Value: func(o order) string { return "pi-" + o.ID }}}}
	def, err := saga.Define(spec)
	if err != nil {
		panic(err)
	}
	return def
}()

// keyedScenario is paidScenario with the provider's webhooks addressed
// by payment id, not saga id: p1's confirmation early and twice, p2's
// decline and confirmation racing, nothing for p3.
func keyedScenario(h *sagatest.H) error {
	if err := participants(h, "stock"); err != nil {
		return err
	}
	if err := h.Register(keyedDef); err != nil {
		return err
	}
	h.AddEvents("psp.webhooks", func(msg *message.Message) (saga.EventTarget, error) {
		return saga.EventTarget{Type: "keyed-order", Key: "payment_id", Value: msg.Metadata.Get("payment_id"),
			Event: msg.Metadata.Get("psp_event"), EventID: msg.Metadata.Get("psp_event_id")}, nil
	})
	for _, id := range []string{"p1", "p2", "p3"} {
		if _, err := saga.Start(h.Context(), h.Orchestrator(), keyedDef, id, order{ID: id, Amount: 10}); err != nil {
			return err
		}
	}
	for _, e := range []struct{ payment, name, id string }{
		{"pi-p1", "payment.confirmed", "psp-1"}, {"pi-p1", "payment.confirmed", "psp-1"},
		{"pi-p2", "payment.declined", "psp-2a"}, {"pi-p2", "payment.confirmed", "psp-2b"},
	} {
		err := pgx.BeginFunc(h.Context(), h.Pool(), func(tx pgx.Tx) error {
			_, err := h.Writer().WriteTx(h.Context(), tx, outbox.Event{Topic: "psp.webhooks", PartitionKey: e.payment,
				Payload: []byte(`{"ref": "` + e.id + `"}`), AggregateType: "webhook", AggregateID: e.payment, EventType: e.name,
				Metadata: map[string]string{"payment_id": e.payment, "psp_event": e.name, "psp_event_id": e.id}})
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Keyed signals under every single fault at every delivery, timer and
// event (an early event, a duplicate, one delayed past the end: refused,
// no saga holding the key), then random combinations: the same outcomes as
// by saga id.
func TestKeyedSignalsExplored(t *testing.T) {
	t.Parallel()
	cfg := sagatest.Config{Effects: paidEffects, Check: paidCheck}
	sagatest.Explore(t, sagatest.ExploreConfig{Config: cfg, Enumerate: true, Runs: 10, Seed: 11}, keyedScenario)
}

// After the end, the key is no longer held.
func TestKeyedSignalAfterTheEnd(t *testing.T) {
	t.Parallel()
	h := sagatest.New(t, sagatest.Config{Effects: paidEffects, Check: paidCheck})
	if err := keyedScenario(h); err != nil {
		t.Fatal(err)
	}
	h.Run(t)
	err := saga.SignalByKey(h.Context(), h.Orchestrator(), "keyed-order", "payment_id", "pi-p1", "payment.confirmed", "psp-late", nil)
	if !errors.Is(err, saga.ErrKeyNotHeld) {
		t.Fatalf("after the end: %v", err)
	}
}
