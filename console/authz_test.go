package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

var metaTokenRE = regexp.MustCompile(`<meta name="csrf-token" content="([^"]+)">`)

// as returns the headers of a request from the proxy for user with roles.
func as(user string, roles ...string) http.Header {
	return http.Header{"X-Forwarded-User": {user}, "X-Forwarded-Groups": {strings.Join(roles, ",")}}
}

// changes is a fingerprint of everything an action could change: the
// dead letters, the sagas' revisions and requests, the bulk operations
// and the audit trail.
func changes(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	tbl := func(name string) string { return sqlident.Table(db.Schema, name) }
	var out string
	err := db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT
  (SELECT count(*) FROM %s WHERE dead) || '/' ||
  (SELECT count(*) FROM %s WHERE dead_at IS NOT NULL AND NOT processed) || '/' ||
  (SELECT coalesce(sum(version), 0) FROM %s) || '/' ||
  (SELECT count(*) FROM %s WHERE operator_request IS NOT NULL) || '/' ||
  (SELECT count(*) FROM %s) || '/' ||
  (SELECT count(*) FROM %s)`, tbl("outbox_pending"), tbl("inbox_event"), tbl("saga_instance"), tbl("saga_instance"),
		tbl("saga_bulk_operation"), tbl("audit_log"))).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Every action, for each built-in role: the roles that may take it get
// past the authorizer, a lesser role is refused with 403 and nothing
// changes (dead letters, sagas, bulk operations, the audit trail). The
// pages draw only the buttons of what the identity may do, and show
// payloads whole only to those who may read them.
func TestRolesMayDoWhatTheyMay(t *testing.T) {
	t.Parallel()
	type step struct {
		name string
		path string
		form url.Values
		// allowed: the roles that get past the authorizer.
		allowed []string
	}
	for _, role := range []string{"viewer", "operator", "admin", "nobody"} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			outboxDead := opstest.OutboxDead(t, db, "orders", 3)
			inboxDead := opstest.InboxDead(t, db, "billing", 3)
			s := opstest.NewSagas(t, db)
			s.StuckRefunds(t, db, "refund", 3)
			s.WaitingShip(t, "ship-1")
			b := setupOn(t, db, console.Config{Sagas: s.O})
			who := as("pat", role)
			admin := as("ada", "admin")
			// A plan of each kind, made by an admin, for the confirmations.
			plan := func(action string) string {
				token := tokenRE.FindStringSubmatch(b.do(b.client, http.MethodGet, "/sagas?type=refund", nil, admin).body)[1]
				r := b.do(b.client, http.MethodPost, "/sagas/bulk", url.Values{"csrf_token": {token}, "type": {"refund"},
					"action": {action}, "reason": {"plan"}}, admin)
				return regexp.MustCompile(`id=([^&]+)`).FindStringSubmatch(r.location)[1]
			}
			retryPlan, abortPlan := plan("retry"), plan("abort")
			// A pending request on refund-0003, for the withdrawal.
			if _, err := opstest.NewOrchestrator(t, db).Request(context.Background(), "refund-0003", "retry",
				core.Actor{Operator: "ada", Reason: "try"}); err != nil {
				t.Fatal(err)
			}
			client := b.newClient()
			page := b.do(client, http.MethodGet, "/outbox/dead", nil, who)
			if role == "nobody" {
				// Every page asks the authorizer: an identity without a
				// role sees none of them.
				for _, path := range []string{"/", "/outbox/dead", "/inbox/dead", "/inbox/dead?consumer=billing", "/sagas",
					"/saga?id=refund-0001", "/sagas/bulk?id=" + retryPlan, "/poison", "/kafka/lag", "/audit",
					"/saga/retry?id=refund-0001", "/outbox/dead/requeue?id=" + outboxDead[0], "/outbox/dead/bulk/requeue?topic=orders",
					"/inbox/dead/discard?consumer=billing&id=" + inboxDead[0]} {
					r := b.do(client, http.MethodGet, path, nil, who)
					if r.status != http.StatusForbidden || !strings.Contains(r.body, "pat has no console role") || strings.Contains(r.body, "refund-0001</a>") {
						t.Errorf("an identity without a role reads %s: %d", path, r.status)
					}
				}
				return
			}
			// Every page carries the identity's token, forms or not: a
			// forged form posts it, and the authorizer must refuse it.
			token := metaTokenRE.FindStringSubmatch(page.body)
			if page.status != http.StatusOK || token == nil {
				t.Fatalf("a %s cannot read the dead letters: %d\n%s", role, page.status, page.body)
			}
			// The pages draw what the role may do, and payloads as it may see
			// them (before anything is acted on).
			sagaPage := b.do(client, http.MethodGet, "/saga?id=refund-0002", nil, who).body
			deadPage := b.do(client, http.MethodGet, "/outbox/dead", nil, who).body
			inboxPage := b.do(client, http.MethodGet, "/inbox/dead?consumer=billing", nil, who).body
			listPage := b.do(client, http.MethodGet, "/sagas?type=refund", nil, who).body
			checks := map[string]bool{
				"saga actions":             strings.Contains(sagaPage, `id="saga-actions"`),
				"saga data whole":          strings.Contains(sagaPage, `&#34;id&#34;: &#34;refund-0002&#34;`),
				"saga data redacted":       strings.Contains(sagaPage, `&#34;id&#34;: &#34;[redacted]&#34;`),
				"requeue button":           strings.Contains(deadPage, `>Requeue</a>`),
				"discard button":           strings.Contains(deadPage, `>Discard</a>`),
				"inbox payload redacted":   strings.Contains(inboxPage, `&#34;n&#34;: &#34;[redacted]&#34;`),
				"bulk retry offered":       strings.Contains(listPage, `<option value="retry">`),
				"bulk abort offered":       strings.Contains(listPage, `<option value="abort">`),
				"audit page in the nav":    strings.Contains(deadPage, `href="/audit"`),
				"operator named with role": strings.Contains(deadPage, `<b id="operator">pat</b> <small id="roles">(`+role+`)</small>`),
			}
			want := map[string]map[string]bool{
				"viewer":   {"saga data redacted": true, "inbox payload redacted": true, "audit page in the nav": true, "operator named with role": true},
				"operator": {"saga actions": true, "saga data whole": true, "requeue button": true, "bulk retry offered": true, "audit page in the nav": true, "operator named with role": true},
				"admin": {"saga actions": true, "saga data whole": true, "requeue button": true, "discard button": true, "bulk retry offered": true,
					"bulk abort offered": true, "audit page in the nav": true, "operator named with role": true},
			}[role]
			for what, got := range checks {
				if got != want[what] {
					t.Errorf("%s: %s is %v, want %v", role, what, got, want[what])
				}
			}
			rev := func(id string) string { return fmt.Sprint(s.Get(t, id).Revision) }
			steps := []step{
				{"retry one saga", "/saga/retry", url.Values{"id": {"refund-0001"}, "revision": {rev("refund-0001")}}, []string{"operator", "admin"}},
				{"pause one saga", "/saga/pause", url.Values{"id": {"ship-1"}, "revision": {rev("ship-1")}}, []string{"operator", "admin"}},
				{"withdraw a request", "/saga/withdraw", url.Values{"id": {"refund-0003"}, "revision": {rev("refund-0003")}}, []string{"operator", "admin"}},
				{"plan a bulk retry", "/sagas/bulk", url.Values{"type": {"refund"}, "action": {"retry"}}, []string{"operator", "admin"}},
				{"plan a bulk abort", "/sagas/bulk", url.Values{"type": {"refund"}, "action": {"abort"}}, []string{"admin"}},
				{"confirm a bulk abort", "/sagas/bulk/apply", url.Values{"id": {abortPlan}}, []string{"admin"}},
				{"confirm a bulk retry", "/sagas/bulk/apply", url.Values{"id": {retryPlan}}, []string{"operator", "admin"}},
				{"requeue an outbox dead letter", "/outbox/dead/requeue", url.Values{"id": {outboxDead[0]}}, []string{"operator", "admin"}},
				{"discard an outbox dead letter", "/outbox/dead/discard", url.Values{"id": {outboxDead[1]}}, []string{"admin"}},
				{"discard outbox dead letters in bulk", "/outbox/dead/bulk/discard", url.Values{"topic": {"orders"}}, []string{"admin"}},
				{"requeue an inbox dead letter", "/inbox/dead/requeue", url.Values{"consumer": {"billing"}, "id": {inboxDead[0]}}, []string{"operator", "admin"}},
				{"discard an inbox dead letter", "/inbox/dead/discard", url.Values{"consumer": {"billing"}, "id": {inboxDead[1]}}, []string{"admin"}},
				{"requeue inbox dead letters in bulk", "/inbox/dead/bulk/requeue", url.Values{"consumer": {"billing"}, "older": {"0s"}}, []string{"operator", "admin"}},
				{"requeue a poisoned message", "/poison/requeue", url.Values{"topic": {"orders.poison"}, "id": {"0190c3f4-0000-7000-8000-000000000001"}}, []string{"operator", "admin"}},
			}
			for _, st := range steps {
				st.form.Set("csrf_token", token[1])
				st.form.Set("reason", "role test")
				before := changes(t, db)
				r := b.do(client, http.MethodPost, st.path, st.form, who)
				may := strings.Contains(strings.Join(st.allowed, " "), role)
				switch {
				case may && r.status == http.StatusForbidden:
					t.Errorf("%s may %s, but was refused: %s", role, st.name, r.body)
				case !may && r.status != http.StatusForbidden:
					t.Errorf("%s may not %s, but got %d", role, st.name, r.status)
				case !may:
					if !strings.Contains(r.body, "Nothing was changed") || !strings.Contains(r.body, "pat is "+role) {
						t.Errorf("%s refused to %s without saying why:\n%s", role, st.name, r.body)
					}
					if after := changes(t, db); after != before {
						t.Errorf("%s refused to %s, but something changed: %s -> %s", role, st.name, before, after)
					}
				}
			}

			if r := b.do(client, http.MethodGet, "/audit", nil, who); r.status != http.StatusOK {
				t.Errorf("%s cannot read the audit trail: %d", role, r.status)
			}
		})
	}
}

// ByRole: each role's actions, and a refusal that says who and why.
func TestByRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		roles  []string
		action console.Action
		op     string
		ok     bool
	}{
		{[]string{"viewer"}, "read", "", true},
		{[]string{"viewer"}, "read-payload", "", false},
		{[]string{"viewer"}, "act", "retry", false},
		{[]string{"operator"}, "act", "abort", true},
		{[]string{"operator"}, "act-bulk", "retry", true},
		{[]string{"operator"}, "act-bulk", "pause", true},
		{[]string{"operator"}, "act-bulk", "skip", false},
		{[]string{"operator"}, "discard", "", false},
		{[]string{"viewer", "admin"}, "discard", "", true},
		{[]string{"admin"}, "act-bulk", "abort", true},
		{[]string{"sre"}, "read", "", false},
		{nil, "read", "", false},
	} {
		err := console.ByRole(ctx, console.Identity{Name: "pat", Roles: c.roles}, c.action, console.Resource{Kind: "saga", Op: c.op})
		if (err == nil) != c.ok {
			t.Errorf("%v %s %s: %v, want allowed %v", c.roles, c.action, c.op, err, c.ok)
		}
	}
}

// A custom Authorize decides per service and saga type, and its reason is
// what the refused operator reads.
func TestCustomAuthorize(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	var asked []console.Resource
	b := setupOn(t, db, console.Config{Sagas: s.O, Authorize: func(ctx context.Context, who console.Identity, action console.Action, res console.Resource) error {
		asked = append(asked, res)
		if action == "act" && res.Type == "refund" && who.Name != "finance" {
			return errors.New("refunds are finance's")
		}
		return console.ByRole(ctx, who, action, res)
	}})
	r := b.get("/saga?id=refund-1")
	if strings.Contains(r.body, `id="action-retry"`) {
		t.Error("the page offers retry to someone the authorizer refuses it")
	}
	r = b.get("/saga/retry?id=refund-1")
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "Forbidden: refunds are finance&#39;s.") {
		t.Errorf("confirm page: %d\n%s", r.status, r.body)
	}
	found := false
	for _, res := range asked {
		found = found || res.Kind == "saga" && res.Type == "refund" && res.ID == "refund-1" && res.Op == "retry"
	}
	if !found {
		t.Errorf("the authorizer was not asked about retrying refund-1: %+v", asked)
	}
}

// ProxyAuth believes its headers only from the proxies' addresses;
// TokenAuth takes a bearer token, else the session cookie, and refuses a
// request with neither; the console answers a request without an
// identity with 401 and shows nothing.
func TestAuthenticators(t *testing.T) {
	t.Parallel()
	proxy := console.ProxyAuth("X-User", "X-Roles", netip.MustParsePrefix("10.1.2.0/24"))
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-User", "alice")
	req.Header.Set("X-Roles", "operator, admin")
	for addr, ok := range map[string]bool{"10.1.2.3:5555": true, "[::ffff:10.1.2.3]:5555": true, "10.1.3.3:5555": false, "127.0.0.1:5555": false} {
		req.RemoteAddr = addr
		id, err := proxy(req)
		if ok && (err != nil || id.Name != "alice" || strings.Join(id.Roles, "|") != "operator|admin") {
			t.Errorf("from %s: %+v, %v; want alice, operator and admin", addr, id, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), "not a trusted proxy")) {
			t.Errorf("from %s: %+v, %v; want no identity", addr, id, err)
		}
	}
	req.RemoteAddr = "10.1.2.3:5555"
	req.Header.Del("X-User")
	if _, err := proxy(req); err == nil {
		t.Error("a proxy request without the user header has an identity")
	}

	tokens := console.TokenAuth("sid", func(_ context.Context, token string) (console.Identity, error) {
		if token == "good" {
			return console.Identity{Name: "bob", Roles: []string{"viewer"}}, nil
		}
		return console.Identity{}, errors.New("unknown session")
	})
	for name, set := range map[string]func(*http.Request){
		"bearer": func(r *http.Request) { r.Header.Set("Authorization", "Bearer good") },
		"cookie": func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "sid", Value: "good"}) },
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		set(r)
		if id, err := tokens(r); err != nil || id.Name != "bob" {
			t.Errorf("%s: %+v, %v", name, id, err)
		}
	}
	if _, err := tokens(httptest.NewRequest(http.MethodGet, "/", nil)); err == nil {
		t.Error("a request without a token has an identity")
	}

	b := setup(t, console.Config{Authenticate: tokens})
	opstest.OutboxDead(t, b.db, "orders", 1)
	r := b.do(b.client, http.MethodGet, "/outbox/dead", nil, http.Header{"Authorization": {"Bearer stolen"}})
	if r.status != http.StatusUnauthorized || !strings.Contains(r.body, "unknown session") || strings.Contains(r.body, "orders") {
		t.Errorf("a bad token: %d\n%s", r.status, r.body)
	}
	if r := b.get("/static/console.css"); r.status != http.StatusOK {
		t.Errorf("the stylesheet is not served without an identity: %d", r.status)
	}
}

// Read-only mode, for every role: no action buttons, and every POST is
// refused with 403, changing nothing.
func TestReadOnlyForEveryone(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := opstest.OutboxDead(t, db, "orders", 1)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	b := setupOn(t, db, console.Config{Sagas: s.O, ReadOnly: true})
	page := b.get("/outbox/dead")
	if strings.Contains(page.body, ">Requeue</a>") || strings.Contains(page.body, ">Discard</a>") || strings.Contains(b.get("/saga?id=refund-1").body, `id="saga-actions"`) {
		t.Error("a read-only console draws action buttons for an admin")
	}
	token := tokenRE.FindStringSubmatch(page.body)
	before := changes(t, db)
	for path, form := range map[string]url.Values{
		"/outbox/dead/requeue": {"id": {ids[0]}},
		"/saga/retry":          {"id": {"refund-1"}, "revision": {fmt.Sprint(s.Get(t, "refund-1").Revision)}},
		"/sagas/bulk":          {"type": {"refund"}, "action": {"retry"}},
	} {
		if token != nil {
			form.Set("csrf_token", token[1])
		}
		form.Set("reason", "x")
		if r := b.post(path, form); r.status != http.StatusForbidden || !strings.Contains(r.body, "read-only") {
			t.Errorf("POST %s in read-only mode: %d", path, r.status)
		}
	}
	if after := changes(t, db); after != before {
		t.Errorf("read-only POSTs changed something: %s -> %s", before, after)
	}
}
