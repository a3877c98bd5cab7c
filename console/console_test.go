package console_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// syncBuffer collects the console's log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

type bundle struct {
	t      *testing.T
	db     *pgtest.DB
	srv    *httptest.Server
	client *http.Client // with a cookie jar, like a browser; no redirects followed
	logs   *syncBuffer
	prefix string
	admin  *outbox.Admin
}

// loopback is where the test's requests come from: the "proxy" whose
// identity headers the console believes.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// setup serves a console on a fresh schema; cfg's Schema and Logger are
// filled in, and Authenticate when nil (ProxyAuth from loopback). Every
// request says it comes from operator alice, an admin, unless it says
// otherwise (X-Forwarded-User, X-Forwarded-Groups).
func setup(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	return setupOn(t, pgtest.New(t), cfg)
}

// setupOn is setup on db.
func setupOn(t *testing.T, db *pgtest.DB, cfg console.Config) *bundle {
	t.Helper()
	b := &bundle{t: t, db: db, logs: &syncBuffer{}, prefix: strings.TrimSuffix(cfg.Prefix, "/")}
	cfg.Schema = db.Schema
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
	if cfg.Authenticate == nil {
		cfg.Authenticate = console.ProxyAuth("", "", loopback...)
	}
	c, err := console.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(b.prefix+"/", c)
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	b.client = b.newClient()
	b.admin, err = outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bundle) newClient() *http.Client {
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	b.t.Cleanup(c.CloseIdleConnections)
	return c
}

type response struct {
	status   int
	body     string
	location string
}

func (b *bundle) do(client *http.Client, method, path string, form url.Values, header http.Header) response {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.srv.URL+b.prefix+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("X-Forwarded-User", "alice")
	req.Header.Set("X-Forwarded-Groups", "admin")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	all, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return response{resp.StatusCode, string(all), resp.Header.Get("Location")}
}

func (b *bundle) get(path string) response {
	b.t.Helper()
	return b.do(b.client, http.MethodGet, path, nil, nil)
}

func (b *bundle) post(path string, form url.Values) response {
	b.t.Helper()
	return b.do(b.client, http.MethodPost, path, form, nil)
}

// alice authenticates every request as alice, an admin.
func alice(*http.Request) (console.Identity, error) {
	return console.Identity{Name: "alice", Roles: []string{"admin"}}, nil
}

// sagaPost posts a saga action's form as its confirm page would: with the
// saga's revision as it is now, unless form says one.
func (b *bundle) sagaPost(path string, form url.Values) response {
	b.t.Helper()
	if !form.Has("revision") {
		var rev int64 = 1 // an unknown saga: any revision
		_ = b.db.Pool.QueryRow(context.Background(), fmt.Sprintf("SELECT version FROM %s WHERE id = $1",
			sqlident.Table(b.db.Schema, "saga_instance")), form.Get("id")).Scan(&rev)
		form.Set("revision", strconv.FormatInt(rev, 10))
	}
	return b.post(path, form)
}

var tokenRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// confirm opens a confirm page and returns the token of its form.
func (b *bundle) confirm(path string) string {
	b.t.Helper()
	r := b.get(path)
	if r.status != http.StatusOK {
		b.t.Fatalf("GET %s: %d\n%s", path, r.status, r.body)
	}
	m := tokenRE.FindStringSubmatch(r.body)
	if m == nil {
		b.t.Fatalf("GET %s: no CSRF token in the form:\n%s", path, r.body)
	}
	return m[1]
}

func (b *bundle) stats() outbox.Stats {
	b.t.Helper()
	s, err := b.admin.Stats(context.Background())
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

func (b *bundle) inboxDead(consumer string) []inbox.DeadLetter {
	b.t.Helper()
	dl, err := inbox.NewDeadLetters(b.db.Pool, inbox.DeadLetterConfig{Schema: b.db.Schema, Consumer: consumer})
	if err != nil {
		b.t.Fatal(err)
	}
	list, err := dl.List(context.Background(), core.ListParams{Limit: 1000})
	if err != nil {
		b.t.Fatal(err)
	}
	return list
}

func contains(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, body)
		}
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	opstest.OutboxDead(t, b.db, "orders", 2)
	opstest.Write(t, b.db, "orders", 3)
	opstest.InboxDead(t, b.db, "billing", 2)
	opstest.InboxDead(t, b.db, "shipping", 1)

	r := b.get("/")
	if r.status != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", r.status, r.body)
	}
	contains(t, "overview", r.body,
		`<span class="value" id="pending">3</span>`,
		`<span class="value" id="dead">2</span>`,
		`<span class="value" id="blocked">0</span>`,
		`operator: <b id="operator">alice</b> <small id="roles">(admin)</small>`,
		`<a href="/inbox/dead?consumer=billing">billing</a></td><td class="num">2</td>`,
		`<a href="/inbox/dead?consumer=shipping">shipping</a></td><td class="num">1</td>`,
		`<a href="/sagas">Sagas</a>`,
		`<span class="value" id="sagas-stuck">0</span>`)
	if regexp.MustCompile(`id="oldest">-<`).MatchString(r.body) {
		t.Errorf("oldest pending age not shown although 3 events are pending")
	}
	if r := b.get("/static/console.css"); r.status != http.StatusOK || !strings.Contains(r.body, "table.list") {
		t.Errorf("GET /static/console.css: %d", r.status)
	}
	if r := b.get("/nope"); r.status != http.StatusNotFound || !strings.Contains(r.body, "No such page") {
		t.Errorf("GET /nope: %d", r.status)
	}
}

func TestOutboxDeadPages(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{PageSize: 2})
	orders := opstest.OutboxDead(t, b.db, "orders", 3)
	payments := opstest.OutboxDead(t, b.db, "payments", 1)
	list, err := b.admin.List(context.Background(), core.ListParams{})
	if err != nil {
		t.Fatal(err)
	}

	r := b.get("/outbox/dead")
	contains(t, "first page", r.body, orders[0], orders[1], opstest.Refusal,
		`href="/outbox/dead/requeue?id=`+orders[0]+`&topic=orders"`, `href="/outbox/dead/discard?id=`+orders[0]+`&topic=orders"`,
		fmt.Sprintf(`id="next" href="/outbox/dead?topic=&key=&after=%d"`, list[1].ID))
	if strings.Contains(r.body, orders[2]) {
		t.Errorf("first page of 2 shows the third dead letter")
	}
	r = b.get(fmt.Sprintf("/outbox/dead?after=%d", list[1].ID))
	contains(t, "second page", r.body, orders[2], payments[0], "first page")
	if strings.Contains(r.body, orders[0]) || strings.Contains(r.body, `id="next"`) {
		t.Errorf("second (last) page shows page one's rows or a next link")
	}
	r = b.get("/outbox/dead?topic=payments")
	contains(t, "filtered page", r.body, payments[0])
	if strings.Contains(r.body, orders[0]) {
		t.Errorf("topic filter shows an orders dead letter")
	}
	r = b.get("/outbox/dead?key=nope")
	contains(t, "empty filter", r.body, "No dead letters match the filter.")
	if r := b.get("/outbox/dead?after=x"); r.status != http.StatusBadRequest {
		t.Errorf("after=x: %d, want 400", r.status)
	}
}

func TestOutboxActions(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.OutboxDead(t, b.db, "orders", 2)

	// The confirm page is a GET and changes nothing.
	token := b.confirm("/outbox/dead/requeue?id=" + ids[0])
	r := b.get("/outbox/dead/requeue?id=" + ids[0])
	contains(t, "confirm page", r.body, "Requeue outbox event "+ids[0]+"?", "starting from its first attempt",
		`<form method="post" action="/outbox/dead/requeue">`, `name="id" value="`+ids[0]+`"`, "You act as <b>alice</b>")
	if s := b.stats(); s.Dead != 2 {
		t.Fatalf("after the confirm page, %d dead; want 2 (nothing changed)", s.Dead)
	}

	r = b.post("/outbox/dead/requeue", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "id": {ids[0]}})
	if r.status != http.StatusSeeOther || r.location != "/outbox/dead?kind=outbox&done=requeue&n=1" {
		t.Fatalf("POST requeue: %d to %q\n%s", r.status, r.location, r.body)
	}
	if s := b.stats(); s.Dead != 1 || s.Pending != 1 {
		t.Errorf("after requeue: %+v, want 1 dead, 1 pending", s)
	}
	contains(t, "page after requeue", b.get(r.location).body, `<p class="flash" role="status" id="flash">Requeued 1 outbox dead letter.</p>`)
	contains(t, "log", b.logs.String(), `msg="console: outbox dead letter requeued"`, "operator=alice", "event_id="+ids[0], "count=1", "component=console")

	token = b.confirm("/outbox/dead/discard?id=" + ids[1])
	r = b.post("/outbox/dead/discard", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "id": {ids[1]}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST discard: %d\n%s", r.status, r.body)
	}
	if s := b.stats(); s.Dead != 0 || s.Pending != 1 {
		t.Errorf("after discard: %+v, want 0 dead, 1 pending", s)
	}
	contains(t, "log", b.logs.String(), `msg="console: outbox dead letter discarded"`, "event_id="+ids[1])

	// Again: it is no longer a dead letter.
	r = b.post("/outbox/dead/discard", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "id": {ids[0]}})
	if r.status != http.StatusNotFound || !strings.Contains(r.body, "is not an outbox dead letter (unknown, or already requeued or discarded): nothing was changed.") {
		t.Errorf("discard of a requeued event: %d\n%s", r.status, r.body)
	}
	if s := b.stats(); s.Pending != 1 {
		t.Errorf("discard of a requeued event changed the backlog: %+v", s)
	}
}

// A POST is refused unless it carries the token that matches its cookie;
// refused, it changes nothing.
func TestCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.OutboxDead(t, b.db, "orders", 1)
	token := b.confirm("/outbox/dead/requeue?id=" + ids[0])
	refused := func(what string, r response) {
		t.Helper()
		if r.status != http.StatusForbidden {
			t.Errorf("%s: %d, want 403\n%s", what, r.status, r.body)
		}
		if s := b.stats(); s.Dead != 1 {
			t.Fatalf("%s: the dead letter was requeued", what)
		}
	}
	r := b.post("/outbox/dead/requeue", url.Values{"id": {ids[0]}})
	refused("no token", r)
	contains(t, "refusal", r.body, "Missing or invalid CSRF token: nothing was changed.")
	refused("forged token", b.post("/outbox/dead/requeue", url.Values{"id": {ids[0]}, "csrf_token": {"AAAA" + token[4:]}}))
	// A valid token with another browser's cookie, or with none.
	other := b.newClient()
	refused("token without its cookie", b.do(other, http.MethodPost, "/outbox/dead/requeue", url.Values{"id": {ids[0]}, "csrf_token": {token}}, nil))
	otherToken := tokenRE.FindStringSubmatch(b.do(other, http.MethodGet, "/outbox/dead/requeue?id="+ids[0], nil, nil).body)[1]
	if otherToken == token {
		t.Fatal("two browsers got the same token")
	}
	refused("another browser's token", b.post("/outbox/dead/requeue", url.Values{"id": {ids[0]}, "csrf_token": {otherToken}}))
	// A cross-site POST from a browser, even with the right token.
	refused("cross-site", b.do(b.client, http.MethodPost, "/outbox/dead/requeue", url.Values{"id": {ids[0]}, "csrf_token": {token}},
		http.Header{"Sec-Fetch-Site": {"cross-site"}, "Origin": {"https://evil.example"}}))
	contains(t, "log", b.logs.String(), "action refused: missing or invalid CSRF token")

	// The right token goes through.
	if r := b.post("/outbox/dead/requeue", url.Values{"id": {ids[0]}, "csrf_token": {token}, "reason": {"fixed"}}); r.status != http.StatusSeeOther {
		t.Errorf("with the token: %d\n%s", r.status, r.body)
	}
	if s := b.stats(); s.Dead != 0 {
		t.Errorf("with the token the dead letter stays dead")
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.OutboxDead(t, b.db, "orders", 1)
	token := b.confirm("/outbox/dead/requeue?id=" + ids[0])
	for _, tc := range []struct {
		path   string
		form   url.Values
		status int
		want   string
	}{
		{"/outbox/dead/requeue", url.Values{"id": {"nope"}}, 400, `Event id &#34;nope&#34; is not a UUID: nothing was changed.`},
		{"/outbox/dead/requeue", url.Values{"id": {ids[0] + "," + ids[0]}}, 400, `is not a UUID`},
		{"/outbox/dead/requeue", url.Values{}, 400, `Event id &#34;&#34; is not a UUID`},
		{"/outbox/dead/requeue", url.Values{"id": {"0192f5c4-0000-7000-8000-000000000000"}}, 404, `is not an outbox dead letter`},
		{"/outbox/dead/explode", url.Values{"id": {ids[0]}}, 404, `Unknown action &#34;explode&#34;: nothing was changed.`},
		{"/inbox/dead/requeue", url.Values{"id": {ids[0]}}, 400, `No consumer given: nothing was changed.`},
		{"/inbox/dead/requeue", url.Values{"id": {ids[0]}, "consumer": {"billing"}}, 404, `is not an inbox dead letter`},
	} {
		tc.form.Set("csrf_token", token)
		tc.form.Set("reason", "testing")
		r := b.post(tc.path, tc.form)
		if r.status != tc.status || !strings.Contains(r.body, tc.want) {
			t.Errorf("POST %s %v: %d, want %d with %q\n%s", tc.path, tc.form, r.status, tc.status, tc.want, r.body)
		}
	}
	if r := b.get("/outbox/dead/requeue?id=nope"); r.status != 400 {
		t.Errorf("confirm page of a bad id: %d", r.status)
	}
	if s := b.stats(); s.Dead != 1 || s.Pending != 0 {
		t.Errorf("bad input changed the outbox: %+v", s)
	}
}

func TestReadOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{ReadOnly: true})
	ids := opstest.OutboxDead(t, b.db, "orders", 1)
	opstest.InboxDead(t, b.db, "billing", 1)

	r := b.get("/outbox/dead")
	contains(t, "read-only list", r.body, ids[0], opstest.Refusal, `<span class="badge">read-only</span>`)
	if strings.Contains(r.body, "/outbox/dead/requeue") || strings.Contains(r.body, "Discard") {
		t.Errorf("read-only list has action buttons")
	}
	if r := b.get("/inbox/dead?consumer=billing"); strings.Contains(r.body, "/inbox/dead/requeue") {
		t.Errorf("read-only inbox list has action buttons")
	}
	if r := b.get("/outbox/dead/requeue?id=" + ids[0]); r.status != http.StatusForbidden {
		t.Errorf("read-only confirm page: %d", r.status)
	}
	// A POST is refused before anything else is looked at.
	r = b.post("/outbox/dead/requeue", url.Values{"id": {ids[0]}})
	if r.status != http.StatusForbidden || !strings.Contains(r.body, "The console is read-only: nothing was changed.") {
		t.Errorf("read-only POST: %d\n%s", r.status, r.body)
	}
	if s := b.stats(); s.Dead != 1 {
		t.Errorf("read-only console requeued")
	}
}

func TestInboxActions(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.InboxDead(t, b.db, "billing", 2)
	other := opstest.InboxDead(t, b.db, "shipping", 1)

	contains(t, "consumers page", b.get("/inbox/dead").body, `href="/inbox/dead?consumer=billing"`, `href="/inbox/dead?consumer=shipping"`)
	r := b.get("/inbox/dead?consumer=billing")
	contains(t, "billing page", r.body, ids[0], ids[1], opstest.InboxFailure,
		`href="/inbox/dead/requeue?consumer=billing&id=`+ids[0]+`"`)
	if strings.Contains(r.body, other[0]) {
		t.Errorf("billing page shows shipping's dead letter")
	}

	token := b.confirm("/inbox/dead/requeue?consumer=billing&id=" + ids[0])
	contains(t, "confirm page", b.get("/inbox/dead/requeue?consumer=billing&id="+ids[0]).body,
		"Requeue the message "+ids[0]+" of consumer billing?", `name="consumer" value="billing"`)
	// Another consumer's message through this consumer: refused, unchanged.
	r = b.post("/inbox/dead/requeue", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "consumer": {"billing"}, "id": {other[0]}})
	if r.status != http.StatusNotFound {
		t.Errorf("requeue of shipping's message as billing's: %d", r.status)
	}
	if len(b.inboxDead("shipping")) != 1 {
		t.Fatal("shipping's dead letter changed")
	}

	r = b.post("/inbox/dead/requeue", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "consumer": {"billing"}, "id": {ids[0]}})
	if r.status != http.StatusSeeOther || r.location != "/inbox/dead?consumer=billing&kind=inbox&done=requeue&n=1" {
		t.Fatalf("POST requeue: %d to %q\n%s", r.status, r.location, r.body)
	}
	r = b.post("/inbox/dead/discard", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "consumer": {"billing"}, "id": {ids[1]}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST discard: %d\n%s", r.status, r.body)
	}
	if left := b.inboxDead("billing"); len(left) != 0 {
		t.Errorf("billing still has %d dead letters", len(left))
	}
	contains(t, "page after", b.get("/inbox/dead?consumer=billing&kind=inbox&done=discard&n=1").body, "Discarded 1 inbox dead letter.", "No dead letters.")
	contains(t, "log", b.logs.String(), `msg="console: inbox dead letter requeued"`, `msg="console: inbox dead letter discarded"`, "consumer=billing", "operator=alice")
}

func TestInboxPageLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{PageSize: 2, InboxConsumers: []string{"billing", "quiet"}})
	ids := opstest.InboxDead(t, b.db, "billing", 3)
	opstest.InboxDead(t, b.db, "unlisted", 1)
	r := b.get("/")
	contains(t, "overview", r.body, `consumer=billing">billing</a></td><td class="num">2+</td>`, `consumer=quiet">quiet</a></td><td class="num">0</td>`)
	if strings.Contains(r.body, "unlisted") {
		t.Errorf("a consumer not in InboxConsumers is shown")
	}
	r = b.get("/inbox/dead?consumer=billing")
	contains(t, "billing page", r.body, ids[0], ids[1], "More are waiting")
	if strings.Contains(r.body, ids[2]) {
		t.Errorf("page of 2 shows the third")
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Prefix: "/ops/"})
	ids := opstest.OutboxDead(t, b.db, "orders", 1)
	r := b.get("/")
	contains(t, "overview under /ops", r.body, `href="/ops/static/console.css"`, `href="/ops/outbox/dead"`)
	contains(t, "list under /ops", b.get("/outbox/dead").body, `href="/ops/outbox/dead/requeue?id=`+ids[0])
	token := b.confirm("/outbox/dead/requeue?id=" + ids[0])
	contains(t, "confirm under /ops", b.get("/outbox/dead/requeue?id="+ids[0]).body, `action="/ops/outbox/dead/requeue"`)
	r = b.post("/outbox/dead/requeue", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "id": {ids[0]}})
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.location, "/ops/outbox/dead?") {
		t.Errorf("POST under /ops: %d to %q", r.status, r.location)
	}
	if s := b.stats(); s.Dead != 0 {
		t.Errorf("requeue under /ops did nothing")
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	for _, tc := range []struct {
		name string
		cfg  console.Config
	}{
		{"bad schema", console.Config{Schema: "Bad Name"}},
		{"short CSRF key", console.Config{CSRFKey: []byte("short")}},
		{"relative prefix", console.Config{Prefix: "ops"}},
		{"page size", console.Config{PageSize: -1}},
		{"empty consumer", console.Config{InboxConsumers: []string{""}}},
		{"no Authenticate", console.Config{}},
	} {
		if tc.name != "no Authenticate" {
			tc.cfg.Authenticate = console.ProxyAuth("", "", loopback...)
		}
		if _, err := console.New(db.Pool, tc.cfg); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", tc.name, err)
		}
	}
	if _, err := console.New(nil, console.Config{}); !errors.Is(err, core.ErrConfig) {
		t.Errorf("nil pool: err %v, want ErrConfig", err)
	}
}

// The token is bound to the key: a console with another key (a restart
// without CSRFKey) refuses the old page's form; replicas sharing CSRFKey
// accept each other's.
func TestCSRFKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := opstest.OutboxDead(t, db, "orders", 2)
	key := bytes.Repeat([]byte("k"), 32)
	serve := func(key []byte) *httptest.Server {
		c, err := console.New(db.Pool, console.Config{Schema: db.Schema, CSRFKey: key, Logger: slog.New(slog.DiscardHandler),
			Authenticate: alice})
		if err != nil {
			t.Fatal(err)
		}
		s := httptest.NewServer(c)
		t.Cleanup(s.Close)
		return s
	}
	a, replica, other := serve(key), serve(key), serve(nil)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get(a.URL + "/outbox/dead/requeue?id=" + ids[0])
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	token := tokenRE.FindStringSubmatch(string(page))[1]
	post := func(srv *httptest.Server, id string) int {
		// The cookie was set for a's host; the servers share 127.0.0.1, and
		// cookies ignore ports.
		resp, err := client.PostForm(srv.URL+"/outbox/dead/requeue", url.Values{"csrf_token": {token}, "id": {id}, "reason": {"fixed"}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(other, ids[0]); code != http.StatusForbidden {
		t.Errorf("token from a console with another key: %d, want 403", code)
	}
	if code := post(replica, ids[1]); code != http.StatusSeeOther {
		t.Errorf("token from a replica with the same key: %d, want 303", code)
	}
}

// An event written to two topics whose copies were both dead-lettered: the
// page's buttons name the copy's topic, and acting on one copy leaves the
// other dead (it once discarded both: the action went by event id alone).
func TestOutboxActionOnOneCopyOfAFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.NewString()
	if _, err := w.Write(context.Background(),
		outbox.Event{ID: id, Topic: "orders", PartitionKey: "k", Payload: []byte(`{}`)},
		outbox.Event{ID: id, Topic: "audit", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	opstest.Relay(t, b.db, opstest.Refuse{}, func(s outbox.Stats) bool { return s.Dead >= 2 })

	contains(t, "dead letters page", b.get("/outbox/dead").body,
		`href="/outbox/dead/discard?id=`+id+`&topic=orders"`, `href="/outbox/dead/discard?id=`+id+`&topic=audit"`)
	token := b.confirm("/outbox/dead/discard?id=" + id + "&topic=orders")
	contains(t, "confirm page", b.get("/outbox/dead/discard?id="+id+"&topic=orders").body,
		"Discard outbox event "+id+", its copy on topic orders?", `name="topic" value="orders"`)
	r := b.post("/outbox/dead/discard", url.Values{"reason": {"fixed"}, "csrf_token": {token}, "id": {id}, "topic": {"orders"}})
	if r.status != http.StatusSeeOther || r.location != "/outbox/dead?kind=outbox&done=discard&n=1" {
		t.Fatalf("POST discard of the orders copy: %d to %q\n%s", r.status, r.location, r.body)
	}
	list, err := b.admin.List(context.Background(), core.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].EventID != id || list[0].Topic != "audit" {
		t.Fatalf("dead letters after discarding the orders copy: %+v; want the audit copy alone", list)
	}
}
