package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// tripDef: flight and hotel wait on participants (remote, compensatable),
// pay is local (the pivot).
func tripDef(t *testing.T) *saga.Definition[opstest.Order] {
	t.Helper()
	def, err := saga.Define(saga.Spec[opstest.Order]{
		Type: "trip", Version: 1,
		Steps: []saga.Step[opstest.Order]{
			{Name: "flight", Kind: saga.Compensatable, Action: &saga.Command[opstest.Order]{Topic: "opstest.flight"},
				Compensation: &saga.Command[opstest.Order]{}},
			{Name: "hotel", Kind: saga.Compensatable, Action: &saga.Command[opstest.Order]{Topic: "opstest.hotel"},
				Compensation: &saga.Command[opstest.Order]{}},
			{Name: "pay", Kind: saga.Pivot, Local: func(context.Context, pgx.Tx, *opstest.Order) error { return nil }},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return def
}

// reply delivers a participant's success reply to step's first action.
func reply(t *testing.T, o *saga.Orchestrator, id, step string) {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata = message.Metadata{
		core.MetadataSagaID: id, core.MetadataSagaType: "trip", core.MetadataSagaStep: step,
		core.MetadataSagaAttempt: "1", core.MetadataSagaOperation: core.OperationAction, core.MetadataSagaOutcome: core.OutcomeSuccess,
	}
	if _, err := o.HandleReplies(context.Background(), []*message.Message{msg}); err != nil {
		t.Fatal(err)
	}
}

var inputRE = regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`)

// formOf is the hidden fields of the form on the page at path, as a
// browser would post them.
func formOf(t *testing.T, b *bundle, path string) url.Values {
	t.Helper()
	r := b.get(path)
	if r.status != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", path, r.status, r.body)
	}
	form := url.Values{}
	for _, m := range inputRE.FindAllStringSubmatch(r.body, -1) {
		form.Set(m[1], strings.ReplaceAll(m[2], "&#43;", "+"))
	}
	if form.Get("csrf_token") == "" {
		t.Fatalf("GET %s: no form\n%s", path, r.body)
	}
	return form
}

// Issue 39, defect 8: the operator opens Skip's confirm page while the
// saga waits at step flight; a reply moves it on to hotel; the operator
// confirms. The form carries the revision the operator saw, and the skip
// is refused as stale: hotel, which the operator never saw, is not
// skipped. The same in both configurations: a console with the saga's
// definition (it acts) and one without (it files a request).
func TestSagaActionOnAStepTheOperatorNeverSawIsRefused(t *testing.T) {
	t.Parallel()
	for _, withDefinitions := range []bool{true, false} {
		db := pgtest.New(t)
		o := opstest.NewOrchestrator(t, db)
		if err := o.Register(tripDef(t)); err != nil {
			t.Fatal(err)
		}
		cfg := console.Config{}
		if withDefinitions {
			cfg.Sagas = o
		}
		b := setupOn(t, db, cfg)
		if _, err := saga.Start(context.Background(), o, tripDef(t), "trip-1", opstest.Order{ID: "trip-1"}); err != nil {
			t.Fatal(err)
		}
		form := formOf(t, b, "/saga/skip?id=trip-1")
		reply(t, o, "trip-1", "flight")
		moved, err := o.Get(context.Background(), "trip-1")
		if err != nil || moved.Step != "hotel" {
			t.Fatalf("the reply did not move the saga to hotel: %+v, %v", moved, err)
		}
		form.Set("reason", "booked by phone")
		r := b.post("/saga/skip", form)
		if r.status != http.StatusConflict || !strings.Contains(r.body, "changed since you looked") {
			t.Errorf("definitions %v: a skip confirmed on step flight, the saga now at hotel: %d, want 409 stale\n%s", withDefinitions, r.status, r.body)
		}
		in, err := o.Get(context.Background(), "trip-1")
		if err != nil {
			t.Fatal(err)
		}
		if in.Revision != moved.Revision || in.Request != nil || in.Steps["hotel"].Status == saga.StepSkipped {
			t.Errorf("definitions %v: the stale skip changed the saga: revision %d -> %d, request %+v, hotel %s",
				withDefinitions, moved.Revision, in.Revision, in.Request, in.Steps["hotel"].Status)
		}
	}
}

// Issue 39, defect 9: alice plans a bulk retry and does not confirm it;
// bob opens its confirm page and confirms. The requests are filed and
// applied in bob's name, not alice's.
func TestBulkConfirmedByAnotherOperatorIsTheirs(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ids := s.StuckRefunds(t, db, "refund", 3)
	b := setupOn(t, db, console.Config{Sagas: s.O})

	token := tokenRE.FindStringSubmatch(b.get("/sagas?status=stuck").body)
	if token == nil {
		t.Fatal("no bulk form on the sagas page")
	}
	r := b.post("/sagas/bulk", url.Values{"csrf_token": {token[1]}, "status": {"stuck"}, "action": {"retry"}, "reason": {"stock service fixed"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("alice's plan: %d\n%s", r.status, r.body)
	}
	page := strings.TrimPrefix(r.location, b.prefix)

	bob := b.newClient()
	asBob := http.Header{"X-Forwarded-User": {"bob"}, "X-Forwarded-Groups": {"admin"}}
	confirm := b.do(bob, http.MethodGet, page, nil, asBob)
	bobToken := tokenRE.FindStringSubmatch(confirm.body)
	if confirm.status != http.StatusOK || bobToken == nil {
		t.Fatalf("bob's confirm page: %d\n%s", confirm.status, confirm.body)
	}
	id := regexp.MustCompile(`id=([^&]+)`).FindStringSubmatch(page)[1]
	r = b.do(bob, http.MethodPost, "/sagas/bulk/apply", url.Values{"csrf_token": {bobToken[1]}, "id": {id}, "reason": {"stock service fixed"}}, asBob)
	if r.status != http.StatusSeeOther {
		t.Fatalf("bob's confirmation: %d\n%s", r.status, r.body)
	}
	for _, sid := range ids {
		in := s.Get(t, sid)
		if in.Request == nil || in.Request.Operator != "bob" {
			t.Errorf("saga %s: request %+v, want bob's (he confirmed it)", sid, in.Request)
		}
	}
	s.Fix.Store(true)
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, sid := range ids {
		hist, err := s.O.History(context.Background(), sid)
		if err != nil {
			t.Fatal(err)
		}
		applied := false
		for _, h := range hist {
			if h.Event == "operator" || h.Event == "operator_request" {
				if h.Actor != "bob" {
					t.Errorf("saga %s: %s by %s, want bob", sid, h.Event, h.Actor)
				}
				applied = applied || h.Event == "operator"
			}
		}
		if !applied {
			t.Errorf("saga %s: the retry was not applied", sid)
		}
	}
}

// Issue 39, suspected: the CSRF token is not bound to the operator. It
// is: a token alice's page carried, with alice's cookie, is refused when
// the request says it is bob's, and nothing changes; bob's own page's
// token goes through.
func TestCSRFTokenIsBoundToTheOperator(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.OutboxDead(t, b.db, "orders", 1)
	aliceToken := tokenRE.FindStringSubmatch(b.get("/outbox/dead/requeue?id=" + ids[0]).body)[1]
	asBob := http.Header{"X-Forwarded-User": {"bob"}, "X-Forwarded-Groups": {"admin"}}
	form := url.Values{"csrf_token": {aliceToken}, "id": {ids[0]}, "reason": {"fixed"}}
	if r := b.do(b.client, http.MethodPost, "/outbox/dead/requeue", form, asBob); r.status != http.StatusForbidden {
		t.Errorf("alice's token posted as bob: %d, want 403", r.status)
	}
	if s := b.stats(); s.Dead != 1 {
		t.Fatalf("alice's token posted as bob requeued the dead letter: %+v", s)
	}
	bobToken := tokenRE.FindStringSubmatch(b.do(b.client, http.MethodGet, "/outbox/dead/requeue?id="+ids[0], nil, asBob).body)[1]
	form.Set("csrf_token", bobToken)
	if r := b.do(b.client, http.MethodPost, "/outbox/dead/requeue", form, asBob); r.status != http.StatusSeeOther {
		t.Errorf("bob's own token: %d, want 303", r.status)
	}
}
