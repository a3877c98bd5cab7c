package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/saga"
)

// setupSagas serves a console whose orchestrator has the test sagas'
// definitions, as a service mounting it would.
func setupSagas(t *testing.T, cfg console.Config) (*bundle, *opstest.Sagas) {
	t.Helper()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	cfg.Sagas = s.O
	return setupOn(t, db, cfg), s
}

func TestSagaPages(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{PageSize: 2})
	s.StuckRefund(t, "refund-1")
	s.StuckRefund(t, "refund-2")
	s.WaitingShip(t, "ship-<1>")

	r := b.get("/")
	contains(t, "overview", r.body, `<span class="value" id="sagas-stuck">2</span>`, `<span class="value" id="sagas-running">1</span>`,
		`<a href="/sagas?status=stuck">list them</a>`)

	r = b.get("/sagas")
	if r.status != http.StatusOK {
		t.Fatalf("GET /sagas: %d\n%s", r.status, r.body)
	}
	// Page 1 of 2: the two newest, the id escaped.
	contains(t, "sagas page 1", r.body, `data-saga-id="ship-&lt;1&gt;"`, `data-saga-id="refund-2"`, `id="next"`)
	if strings.Contains(r.body, `data-saga-id="refund-1"`) {
		t.Error("page 1 of size 2 lists a third saga")
	}
	next := regexpFind(t, r.body, `id="next" href="([^"]+)"`)
	r = b.get(strings.ReplaceAll(strings.TrimPrefix(next, b.prefix), "&amp;", "&"))
	contains(t, "sagas page 2", r.body, `data-saga-id="refund-1"`)
	if strings.Contains(r.body, `id="next"`) || strings.Contains(r.body, `data-saga-id="refund-2"`) {
		t.Error("page 2 is not the last page, or repeats page 1")
	}

	r = b.get("/sagas?status=running")
	contains(t, "running sagas", r.body, `data-saga-id="ship-&lt;1&gt;"`)
	if strings.Contains(r.body, "refund-") {
		t.Error("status=running lists stuck sagas")
	}
	r = b.get("/sagas?type=refund&older=1h")
	contains(t, "old sagas", r.body, "No sagas match.")
	for _, bad := range []string{"/sagas?status=lost", "/sagas?older=soon", "/sagas?cursor=!!"} {
		if r := b.get(bad); r.status != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", bad, r.status)
		}
	}

	r = b.get("/saga?id=refund-1")
	if r.status != http.StatusOK {
		t.Fatalf("GET saga page: %d\n%s", r.status, r.body)
	}
	contains(t, "saga page", r.body, `<span class="status stuck" id="saga-status">stuck</span>`,
		`<td class="mono" id="saga-step">reserve</td>`, `stock service says: no such reservation`,
		`&#34;reserved&#34;: true`, `data-event="started"`, `data-event="stuck"`,
		`href="/saga/retry?id=refund-1&rev=`, `href="/saga/mark-compensated?id=refund-1&rev=`, `>Mark compensated</a>`)
	// Stuck while compensating: only what that state allows is offered.
	for _, forbidden := range []string{`id="action-skip"`, `id="action-abort"`} {
		if strings.Contains(r.body, forbidden) {
			t.Errorf("saga page of a saga stuck compensating offers %s", forbidden)
		}
	}
	if r := b.get("/saga?id=nope"); r.status != http.StatusNotFound {
		t.Errorf("unknown saga: %d", r.status)
	}
	// An event line whose event waited says when it arrived (the line's
	// own time is when it was filed).
	if _, err := b.db.Pool.Exec(context.Background(), `INSERT INTO `+sqlident.Table(b.db.Schema, "saga_history")+`
 (saga_id, at, event, step, operation, attempt, outcome, status, actor, reason, detail)
 VALUES ('ship-<1>', '2026-01-01 12:00:00Z', 'event', 'paid', '', 0, 'consumed', 'running', '', 'payment.confirmed: ',
         '{"name": "payment.confirmed", "event_id": "psp-1", "arrived": 1, "arrived_at": "2026-01-01T11:00:00Z"}')`); err != nil {
		t.Fatal(err)
	}
	r = b.get("/saga?id=" + url.QueryEscape("ship-<1>"))
	contains(t, "saga page with an event", r.body, `data-event="event"`, `(arrived 2026-01-01 11:00:00Z)`)
}

func TestSagaActions(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	s.StuckRefund(t, "refund-1")
	s.WaitingShip(t, "ship-1")

	unchanged := func(what, id string, rev int64) {
		t.Helper()
		if in := s.Get(t, id); in.Revision != rev {
			t.Errorf("%s changed saga %s (revision %d -> %d)", what, id, rev, in.Revision)
		}
	}
	rev := s.Get(t, "refund-1").Revision

	token := b.confirm("/saga/retry?id=refund-1")
	// No token, no reason, a forbidden action: refused, nothing changes.
	r := b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "reason": {"x"}})
	if r.status != http.StatusForbidden {
		t.Errorf("POST without CSRF token: %d", r.status)
	}
	r = b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "csrf_token": {token}})
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "A reason is required") {
		t.Errorf("POST without reason: %d\n%s", r.status, r.body)
	}
	r = b.sagaPost("/saga/skip", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "Refused, nothing was changed") ||
		!strings.Contains(r.body, "this saga is compensating. Use Mark compensated") || strings.Contains(r.body, "MarkCompensated") {
		t.Errorf("skip of a compensating saga: %d, want a refusal in the console's words\n%s", r.status, r.body)
	}
	r = b.sagaPost("/saga/retry", url.Values{"id": {"nope"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusNotFound {
		t.Errorf("retry of an unknown saga: %d", r.status)
	}
	if r := b.sagaPost("/saga/explode", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}}); r.status != http.StatusNotFound {
		t.Errorf("unknown action: %d", r.status)
	}
	unchanged("refused POSTs", "refund-1", rev)

	// Retry, confirmed with a reason: compensated, operator on record.
	s.Fix.Store(true)
	r = b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"stock fixed"}})
	if r.status != http.StatusSeeOther || r.location != "/saga?id=refund-1&done=retry" {
		t.Fatalf("retry: %d to %q\n%s", r.status, r.location, r.body)
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusCompensated {
		t.Errorf("after retry: %s", in.Status)
	}
	contains(t, "page after retry", b.get(r.location).body, `id="flash">Done: retry.`, `saga-status">compensated`, `<td>alice</td>`)
	operatorEntry(t, s, "refund-1", "retry", "alice", "stock fixed")
	contains(t, "log", b.logs.String(), "console: saga retry", "operator=alice", "saga_id=refund-1")

	// Abort the waiting one.
	r = b.sagaPost("/saga/abort", url.Values{"id": {"ship-1"}, "csrf_token": {token}, "reason": {"cancelled"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("abort: %d\n%s", r.status, r.body)
	}
	if in := s.Get(t, "ship-1"); in.Status != saga.StatusCompensating {
		t.Errorf("after abort: %s", in.Status)
	}
	// Ended: no buttons, and actions refused.
	if body := b.get("/saga?id=refund-1").body; strings.Contains(body, "saga-actions") {
		t.Error("an ended saga shows operator actions")
	}
	rev = s.Get(t, "refund-1").Revision
	if r := b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}}); r.status != http.StatusConflict {
		t.Errorf("retry of an ended saga: %d", r.status)
	}
	unchanged("retry of an ended saga", "refund-1", rev)
}

// TestSagaActionsWithoutDefinitions: a console with no saga definitions
// records an action as an operator request (after the same checks), and
// the service's orchestrator applies it.
func TestSagaActionsWithoutDefinitions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	b := setupOn(t, db, console.Config{})
	rev := s.Get(t, "refund-1").Revision
	contains(t, "saga page", b.get("/saga?id=refund-1").body, `saga-status">stuck`, "an action is recorded as a request")
	contains(t, "confirm page", b.get("/saga/retry?id=refund-1").body, `id="request-note"`)
	token := b.confirm("/saga/retry?id=refund-1")

	// Refused by the saga's state before anything is recorded.
	r := b.sagaPost("/saga/skip", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "this saga is compensating. Use Mark compensated") || strings.Contains(r.body, "MarkCompensated") {
		t.Errorf("skip of a compensating saga: %d, want a refusal in the console's words\n%s", r.status, r.body)
	}
	if in := s.Get(t, "refund-1"); in.Revision != rev || in.Request != nil {
		t.Error("a refused request changed the saga")
	}

	r = b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"stock fixed"}})
	if r.status != http.StatusSeeOther || r.location != "/saga?id=refund-1&requested=retry" {
		t.Fatalf("retry: %d to %q\n%s", r.status, r.location, r.body)
	}
	in := s.Get(t, "refund-1")
	if in.Status != saga.StatusStuck || in.Request == nil || in.Request.Operator != "alice" || in.Request.Reason != "stock fixed" {
		t.Fatalf("after the request: %s %+v", in.Status, in.Request)
	}
	contains(t, "page after the request", b.get(r.location).body, `id="flash">Requested: retry.`, `id="saga-request">retry by alice`)
	contains(t, "log", b.logs.String(), "console: saga retry requested", "operator=alice", "saga_id=refund-1")
	// One pending request at a time.
	r = b.sagaPost("/saga/mark-compensated", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "an operator request is pending") {
		t.Errorf("second request: %d\n%s", r.status, r.body)
	}

	// The service's orchestrator applies it as alice.
	s.Fix.Store(true)
	if n, err := s.O.RunDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusCompensated || in.Request != nil {
		t.Errorf("after the orchestrator: %s %+v", in.Status, in.Request)
	}
	operatorEntry(t, s, "refund-1", "retry", "alice", "stock fixed")
}

func TestSagaReadOnly(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{ReadOnly: true})
	s.StuckRefund(t, "refund-1")
	if body := b.get("/saga?id=refund-1").body; strings.Contains(body, "saga-actions") {
		t.Error("read-only console shows saga actions")
	}
	if r := b.get("/saga/retry?id=refund-1"); r.status != http.StatusForbidden {
		t.Errorf("read-only confirm page: %d", r.status)
	}
	if r := b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "reason": {"x"}}); r.status != http.StatusForbidden {
		t.Errorf("read-only POST: %d", r.status)
	}
}

func operatorEntry(t *testing.T, s *opstest.Sagas, id, action, operator, reason string) {
	t.Helper()
	hist, err := s.O.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hist {
		if h.Event == "operator" && h.Actor == operator && h.Reason == reason && strings.Contains(string(h.Detail), fmt.Sprintf("%q", action)) {
			return
		}
	}
	t.Errorf("saga %s: no operator entry %s by %s (%s)", id, action, operator, reason)
}

func regexpFind(t *testing.T, body, re string) string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in\n%s", re, body)
	}
	return m[1]
}

// A pending operator request can be withdrawn from the saga page: the
// orchestrator then has nothing to apply.
func TestSagaWithdrawRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	b := setupOn(t, db, console.Config{})
	token := b.confirm("/saga/retry?id=refund-1")
	r := b.sagaPost("/saga/withdraw", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "no operator request is pending") {
		t.Errorf("withdraw with nothing pending: %d\n%s", r.status, r.body)
	}
	r = b.sagaPost("/saga/retry", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"stock fixed"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("retry: %d\n%s", r.status, r.body)
	}
	contains(t, "saga page", b.get("/saga?id=refund-1").body, `id="action-withdraw" href="/saga/withdraw?id=refund-1&rev=`)
	contains(t, "confirm page", b.get("/saga/withdraw?id=refund-1").body, "Withdraw the pending operator request on saga refund-1?")
	r = b.sagaPost("/saga/withdraw", url.Values{"id": {"refund-1"}, "csrf_token": {token}, "reason": {"not fixed after all"}})
	if r.status != http.StatusSeeOther || r.location != "/saga?id=refund-1&done=withdraw" {
		t.Fatalf("withdraw: %d to %q\n%s", r.status, r.location, r.body)
	}
	contains(t, "page after withdraw", b.get(r.location).body, `pending operator request was withdrawn`)
	if in := s.Get(t, "refund-1"); in.Request != nil || in.Status != saga.StatusStuck {
		t.Fatalf("after withdraw: %s %+v", in.Status, in.Request)
	}
	if n, err := s.O.RunDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("RunDue after withdraw: %d, %v", n, err)
	}
	hist, err := s.O.History(context.Background(), "refund-1")
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, h := range hist {
		found = found || (h.Event == "operator_withdrawn" && h.Actor == "alice" && h.Reason == "not fixed after all")
	}
	if !found {
		t.Errorf("no operator_withdrawn entry in %+v", hist)
	}
	contains(t, "log", b.logs.String(), "console: saga request withdrawn", "operator=alice", "requested_by=alice")
}

// A saga an operator fixed by hand (stuck compensating, then marked
// compensated) shows why it was compensated, not the stuck reason in red;
// the stuck reason and the fix are in the history.
func TestSagaFixedByOperatorShowsItsOutcome(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	stuck := s.StuckRefund(t, "refund-1")
	in, err := s.O.MarkCompensated(context.Background(), "refund-1", saga.Actor{Operator: "alice", Reason: "released by hand"})
	if err != nil || in.Status != saga.StatusCompensated {
		t.Fatalf("MarkCompensated: %v, %+v", err, in)
	}
	r := b.get("/saga?id=refund-1")
	if strings.Contains(r.body, `id="saga-error"`) {
		t.Errorf("a compensated saga shows a last error:\n%s", r.body)
	}
	why := regexpFind(t, r.body, `<td id="saga-outcome">([^<]*)</td>`)
	if !strings.Contains(why, "charge") || strings.Contains(why, "no such reservation") {
		t.Errorf("compensated because %q, want the failure of step charge (not the stuck compensation: %q)", why, stuck.LastError)
	}
	contains(t, "history", r.body, `data-event="stuck"`, `stock service says: no such reservation`,
		`<b class="operator-action">Mark compensated</b>`, "released by hand")
	if strings.Contains(r.body, `id="saga-actions"`) {
		t.Error("an ended saga offers actions")
	}
}

// Pause and resume buttons: offered by state (Pause on a running saga,
// only Resume on a paused one), confirmed with CSRF and a reason, refused
// in the console's words in the wrong state, the operator on record; the
// list filters by paused.
func TestSagaPauseResumeButtons(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	s.WaitingShip(t, "ship-1")
	s.StuckRefund(t, "refund-1")

	contains(t, "running saga page", b.get("/saga?id=ship-1").body, `id="action-pause" href="/saga/pause?id=ship-1&rev=`, `>Pause</a>`)
	if body := b.get("/saga?id=refund-1").body; strings.Contains(body, `id="action-pause"`) {
		t.Error("a stuck saga offers Pause")
	}
	contains(t, "confirm page", b.get("/saga/pause?id=ship-1").body, "fires no timer until it is resumed")
	token := b.confirm("/saga/pause?id=ship-1")
	if r := b.sagaPost("/saga/pause", url.Values{"id": {"ship-1"}, "reason": {"audit"}}); r.status != http.StatusForbidden {
		t.Errorf("pause without CSRF token: %d", r.status)
	}
	r := b.sagaPost("/saga/resume", url.Values{"id": {"ship-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "the saga is not paused (it is running)") {
		t.Errorf("resume of a running saga: %d\n%s", r.status, r.body)
	}
	r = b.sagaPost("/saga/pause", url.Values{"id": {"ship-1"}, "csrf_token": {token}, "reason": {"warehouse audit"}})
	if r.status != http.StatusSeeOther || r.location != "/saga?id=ship-1&done=pause" {
		t.Fatalf("pause: %d to %q\n%s", r.status, r.location, r.body)
	}
	if in := s.Get(t, "ship-1"); in.Status != saga.StatusPaused {
		t.Fatalf("after pause: %s", in.Status)
	}
	operatorEntry(t, s, "ship-1", "pause", "alice", "warehouse audit")
	page := b.get(r.location).body
	contains(t, "paused saga page", page, `id="flash">Done: pause.`, `saga-status">paused`, `id="action-resume" href="/saga/resume?id=ship-1&rev=`)
	for _, forbidden := range []string{`id="action-retry"`, `id="action-skip"`, `id="action-abort"`, `id="action-pause"`} {
		if strings.Contains(page, forbidden) {
			t.Errorf("a paused saga's page offers %s", forbidden)
		}
	}
	contains(t, "paused list", b.get("/sagas?status=paused").body, "ship-1")
	r = b.sagaPost("/saga/retry", url.Values{"id": {"ship-1"}, "csrf_token": {token}, "reason": {"x"}})
	if r.status != http.StatusConflict || !strings.Contains(r.body, "the saga is paused. Resume it first.") {
		t.Errorf("retry of a paused saga: %d\n%s", r.status, r.body)
	}
	r = b.sagaPost("/saga/resume", url.Values{"id": {"ship-1"}, "csrf_token": {token}, "reason": {"audit done"}})
	if r.status != http.StatusSeeOther || r.location != "/saga?id=ship-1&done=resume" {
		t.Fatalf("resume: %d to %q\n%s", r.status, r.location, r.body)
	}
	if in := s.Get(t, "ship-1"); in.Status != saga.StatusRunning {
		t.Fatalf("after resume: %s", in.Status)
	}
	operatorEntry(t, s, "ship-1", "resume", "alice", "audit done")
}
