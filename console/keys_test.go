package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// The sagas list filters by attributes (several, kept across pages and in
// the bulk form); a bad filter is a clear 400. "Retry Ada's stuck sagas"
// is a bulk plan on the same filter.
func TestSagaListFiltersByAttributes(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{PageSize: 1})
	s.StuckRefundOf(t, opstest.Order{ID: "ada-1", Customer: "ada", Amount: 120})
	s.StuckRefundOf(t, opstest.Order{ID: "ada-2", Customer: "ada", Amount: 150})
	s.StuckRefundOf(t, opstest.Order{ID: "bob-1", Customer: "bob", Amount: 300})
	r := b.get("/sagas?status=stuck&attr=customer%3Dada&attr=amount%3E100")
	contains(t, "filtered list", r.body, `data-saga-id="ada-2"`, `name="attr" value="customer=ada"`, `name="attr" value="amount&gt;100"`,
		`<span id="bulk-count">2</span>`, `type="hidden" name="attr" value="customer=ada"`)
	next := regexpFind(t, r.body, `id="next" href="([^"]+)"`)
	r = b.get(strings.ReplaceAll(strings.TrimPrefix(next, b.prefix), "&amp;", "&"))
	contains(t, "page 2", r.body, `data-saga-id="ada-1"`)
	if strings.Contains(r.body, "bob-1") || strings.Contains(r.body, `id="next"`) {
		t.Errorf("page 2 of Ada's sagas:\n%s", r.body)
	}
	contains(t, "saga page", b.get("/saga?id=ada-1").body, `id="saga-attributes"`, `customer=ada</span>`, `amount=120</span>`)
	if r := b.get("/sagas?attr=amount%3Eabc"); r.status != http.StatusBadRequest || !strings.Contains(r.body, "Bad attribute filter") {
		t.Errorf("bad filter: %d\n%s", r.status, r.body)
	}
	token := b.confirm("/sagas?status=stuck&attr=customer%3Dada")
	r = b.post("/sagas/bulk", url.Values{"csrf_token": {token}, "action": {"retry"}, "status": {"stuck"}, "attr": {"customer=ada"}, "reason": {"stock fixed"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("bulk plan: %d\n%s", r.status, r.body)
	}
	id := strings.TrimPrefix(r.location, "/sagas/bulk?id=")
	op, err := s.O.BulkStatus(context.Background(), id)
	if err != nil || op.Counts.Selected != 2 {
		t.Fatalf("bulk plan of Ada's stuck sagas: %+v, %v", op, err)
	}
	contains(t, "bulk page", b.get(r.location).body, `<code class="bulk-attr">customer=ada</code>`, "sagas?attr=customer%3Dada&amp;status=stuck")
}

// A saga's page offers a form to send it an event; sent, the event
// applies (with the definitions) once per event id, by the operator, and
// an event for an ended saga is refused and recorded.
func TestSagaSignalForm(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	s.WaitingPay(t, opstest.Order{ID: "pay-1", PaymentID: "pi-1"})
	r := b.get("/saga?id=pay-1")
	contains(t, "waiting saga's page", r.body, `id="signal-form"`, "The current step waits for an event", `name="event_id" id="signal-event-id" value="`)
	token := b.confirm("/saga?id=pay-1")
	form := url.Values{"id": {"pay-1"}, "csrf_token": {token}, "event": {"payment.confirmed"}, "event_id": {"e-1"},
		"payload": {`{"ref":"console"}`}, "reason": {"webhook lost"}}
	if r := b.sagaPost("/saga/signal", url.Values{"id": {"pay-1"}, "csrf_token": {token}, "event": {"payment.confirmed"},
		"payload": {"{"}, "reason": {"x"}}); r.status != http.StatusBadRequest {
		t.Errorf("a payload that is not JSON: %d", r.status)
	}
	r = b.sagaPost("/saga/signal", form)
	if r.status != http.StatusSeeOther || r.location != "/saga?id=pay-1&done=signal" {
		t.Fatalf("signal: %d to %q\n%s", r.status, r.location, r.body)
	}
	in := s.Get(t, "pay-1")
	var o opstest.Order
	if err := json.Unmarshal(in.Data, &o); err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.StatusCompleted || o.Paid != "console" {
		t.Fatalf("after the event: %s, paid %q", in.Status, o.Paid)
	}
	page := b.get(r.location).body
	contains(t, "page after the event", page, `id="flash">Done: the event was sent.`, `<td>alice</td>`)
	if strings.Contains(page, `id="signal-form"`) {
		t.Error("an ended saga's page offers the event form")
	}
	form.Set("event_id", "e-2")
	form.Del("revision") // as the page shows it now
	if r := b.sagaPost("/saga/signal", form); r.status != http.StatusConflict || !strings.Contains(r.body, "has ended") {
		t.Errorf("an event for an ended saga: %d\n%s", r.status, r.body)
	}
}

// Without the definitions, the console stores the event for the service's
// orchestrator, which applies it.
func TestSagaSignalFormWithoutDefinitions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.WaitingPay(t, opstest.Order{ID: "pay-2", PaymentID: "pi-2"})
	b := setupOn(t, db, console.Config{})
	token := b.confirm("/saga?id=pay-2")
	r := b.sagaPost("/saga/signal", url.Values{"id": {"pay-2"}, "csrf_token": {token}, "event": {"payment.confirmed"},
		"payload": {`{"ref":"later"}`}, "reason": {"webhook lost"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("signal: %d\n%s", r.status, r.body)
	}
	if in := s.Get(t, "pay-2"); in.Status != saga.StatusRunning {
		t.Fatalf("applied without the definition: %s", in.Status)
	}
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	if in := s.Get(t, "pay-2"); in.Status != saga.StatusCompleted {
		t.Fatalf("after the service's pass: %s", in.Status)
	}
}
