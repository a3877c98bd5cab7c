package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// tab is a Chromium tab on a console behind a (simulated) authenticating
// proxy: the tab sends the proxy's identity headers with every request.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
}

// browseBehindProxy serves a console on db with cfg at /ops (Authenticate,
// when nil, believes X-Forwarded-User and X-Forwarded-Groups from this
// host) and opens a Chromium tab on it for three minutes at most.
func browseBehindProxy(t *testing.T, exe string, db *pgtest.DB, cfg console.Config) *tab {
	t.Helper()
	cfg.Schema, cfg.Prefix, cfg.Logger = db.Schema, "/ops", slog.New(slog.DiscardHandler)
	if cfg.Authenticate == nil {
		cfg.Authenticate = console.ProxyAuth("", "", loopback...)
	}
	c, err := console.New(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", c)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.WindowSize(1360, 820))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	return &tab{t: t, ctx: ctx, base: srv.URL + "/ops"}
}

// as makes the tab's requests come from user with roles, as the proxy
// would say.
func (b *tab) as(user string, roles ...string) {
	b.t.Helper()
	_, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{
		"X-Forwarded-User": user, "X-Forwarded-Groups": strings.Join(roles, ","),
	}})
	if err != nil {
		b.t.Fatal(err)
	}
}

func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

func (b *tab) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(sel))
	if err != nil {
		b.t.Fatalf("%s: %v", sel, err)
	}
	return s
}

func (b *tab) count(sel string) int {
	b.t.Helper()
	n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
	if err != nil {
		b.t.Fatal(err)
	}
	return n
}

// TestBrowserViewerAndUntrustedProxy drives the console in Chromium as a
// viewer: the sagas list and a saga's page show the saga with its data
// redacted (none of its values reaches the browser), the pages draw no
// action button and no bulk form, and a POST forged from the viewer's own
// page (a form built through DevTools, carrying the page's valid CSRF
// token) is refused with 403 and changes nothing. Then, against a console
// that trusts only a proxy elsewhere, a request carrying an admin's
// identity headers from this host gets no identity: 401, nothing shown.
func TestBrowserViewerAndUntrustedProxy(t *testing.T) {
	t.Parallel()
	exe := browser(t)
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-7f3a")
	dead := opstest.OutboxDead(t, db, "orders", 1)
	b := browseBehindProxy(t, exe, db, console.Config{Sagas: s.O})
	b.as("vera", "viewer")

	b.do(chromedp.Navigate(b.base+"/sagas"), chromedp.WaitVisible(`tr[data-saga-id="refund-7f3a"]`))
	if n := b.count(`#bulk-form`); n != 0 {
		t.Errorf("the viewer's sagas list offers a bulk form")
	}
	if who := b.text(`#operator`); who != "vera" {
		t.Errorf("the page names %q as the operator, want vera", who)
	}
	b.do(chromedp.Click(`tr[data-saga-id="refund-7f3a"] a`), chromedp.WaitVisible(`#saga-data`))
	data := b.text(`#saga-data`)
	if !strings.Contains(data, `"reserved": "[redacted]"`) || strings.Contains(data, "true") || strings.Contains(data, `"refund-7f3a"`) {
		t.Errorf("the viewer sees the saga's data %s, want every value redacted", data)
	}
	html, err := chromedp.Run(b.ctx, chromedp.OuterHTML(`html`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(html, `"reserved": true`) || strings.Contains(html, `&#34;reserved&#34;: true`) {
		t.Error("the saga's data reached the viewer's browser unredacted")
	}
	if n := b.count(`#saga-actions a, a[id^="action-"]`); n != 0 {
		t.Errorf("the viewer's saga page draws %d action buttons", n)
	}
	b.do(chromedp.Navigate(b.base+"/outbox/dead"), chromedp.WaitVisible(`tr[data-event-id="`+dead[0]+`"]`))
	if n := b.count(`td.actions a, #bulk`); n != 0 {
		t.Errorf("the viewer's dead-letter page draws %d action buttons", n)
	}

	// A forged POST from the viewer's page, with its valid CSRF token.
	in := s.Get(t, "refund-7f3a")
	before := changes(t, db)
	b.do(chromedp.Navigate(b.base+"/saga?id=refund-7f3a"), chromedp.WaitVisible(`#saga-status`))
	forge := fmt.Sprintf(`(() => {
  const f = document.createElement("form");
  f.method = "post"; f.action = %q;
  const add = (n, v) => { const i = document.createElement("input"); i.type = "hidden"; i.name = n; i.value = v; f.appendChild(i); };
  add("csrf_token", document.querySelector('meta[name="csrf-token"]').content);
  add("id", "refund-7f3a"); add("revision", %q); add("reason", "forged");
  document.body.appendChild(f); f.submit(); return true;
})()`, "/ops/saga/retry", fmt.Sprint(in.Revision))
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](forge)); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.WaitVisible(`#error`))
	if msg := b.text(`#error`); !strings.Contains(msg, "Forbidden: vera is viewer") || !strings.Contains(msg, "Nothing was changed") {
		t.Errorf("the forged POST's page says %q", msg)
	}
	if status, err := chromedp.Run(b.ctx, chromedp.Text(`h1`)); err != nil || status != "403" {
		t.Errorf("the forged POST's page is %q, %v; want 403", status, err)
	}
	if after := changes(t, db); after != before {
		t.Errorf("the forged POST changed something: %s -> %s", before, after)
	}

	// A console that trusts only a proxy at 192.0.2.10: this host's
	// request, with an admin's headers, has no identity.
	other := browseBehindProxy(t, exe, db, console.Config{Sagas: s.O,
		Authenticate: console.ProxyAuth("", "", netip.MustParsePrefix("192.0.2.10/32"))})
	other.ctx = b.ctx // the same tab
	other.as("mallory", "admin")
	other.do(chromedp.Navigate(other.base+"/outbox/dead"), chromedp.WaitVisible(`#error`))
	if msg := other.text(`#error`); !strings.Contains(msg, "cannot tell who you are") || !strings.Contains(msg, "not a trusted proxy") {
		t.Errorf("a request with identity headers from an untrusted address: %q", msg)
	}
	if h := other.text(`h1`); h != "401" {
		t.Errorf("the page is %q, want 401", h)
	}
	if n := other.count(`tr[data-event-id]`); n != 0 || other.text(`#operator`) != "" {
		t.Errorf("the untrusted request was shown dead letters (%d) or an operator", n)
	}
}

// TestBrowserOperatorActionsAreAudited drives the console in Chromium as
// operator olga: she retries one stuck saga (its page, Retry, a reason,
// confirm) and a bulk of 100 (the filtered list, "apply to all 100", a
// reason, the confirm page); the service's orchestrator applies the
// requests; the audit page then shows her retry, her plan, and each of
// the 100 requests filed and applied, with her name and reason. Then
// alice (an admin) plans a bulk retry and bob (an operator) confirms it:
// the audit page shows bob's requests on behalf of alice, and the sagas'
// history names both.
func TestBrowserOperatorActionsAreAudited(t *testing.T) {
	t.Parallel()
	exe := browser(t)
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-one")
	bulk := s.StuckRefunds(t, db, "bulk", 100)
	b := browseBehindProxy(t, exe, db, console.Config{Sagas: s.O, PageSize: 500})
	b.as("olga", "operator")
	s.Fix.Store(true) // the stock service is fixed: retries go through

	// One saga.
	b.do(chromedp.Navigate(b.base+"/saga?id=refund-one"), chromedp.WaitVisible(`#action-retry`),
		chromedp.Click(`#action-retry`), chromedp.WaitVisible(`#reason`),
		chromedp.SendKeys(`#reason`, "stock service fixed"), chromedp.Click(`#confirm`), chromedp.WaitVisible(`#flash`))
	if in := s.Get(t, "refund-one"); in.Status != saga.StatusCompensated {
		t.Fatalf("after olga's retry the saga is %s", in.Status)
	}

	// A bulk of 100.
	filter := url.Values{"status": {"stuck"}, "step": {"reserve"}, "type": {"refund"}}
	b.do(chromedp.Navigate(b.base+"/sagas?"+filter.Encode()), chromedp.WaitVisible(`#bulk-apply`))
	if n := b.text(`#bulk-count`); n != "100" {
		t.Fatalf("the list offers to apply to %s, want 100", n)
	}
	b.do(chromedp.SetValue(`#bulk-action`, "retry"), chromedp.SendKeys(`#bulk-reason`, "incident 42: stock back"),
		chromedp.Click(`#bulk-apply`), chromedp.WaitVisible(`#bulk-confirm`), chromedp.Click(`#confirm`), chromedp.WaitVisible(`#bulk-counts`))
	opID := b.text(`#bulk-id`)
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(90 * time.Second); ; {
		if _, err := s.O.RunDue(context.Background()); err != nil {
			t.Fatal(err)
		}
		st, err := p.BulkStatus(context.Background(), opID)
		if err != nil {
			t.Fatal(err)
		}
		if st.Done() {
			if st.Counts.Applied != 100 {
				t.Fatalf("bulk outcome %+v, want 100 applied", st.Counts)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bulk not applied in time: %+v", st.Counts)
		}
	}

	// The audit page: the one retry, and the bulk's plan and 100 sagas,
	// each filed and applied, all olga's with her reason.
	b.do(chromedp.Navigate(b.base+"/audit?target=refund-one"), chromedp.WaitVisible(`#audit`))
	if n := b.count(`tr[data-operator="olga"][data-action="saga.retry"]`); n != 1 {
		t.Errorf("the audit page shows %d retries of refund-one by olga, want 1", n)
	}
	if r := b.text(`#audit td.reason`); r != "stock service fixed" {
		t.Errorf("the retry's reason on the audit page: %q", r)
	}
	b.do(chromedp.Navigate(b.base+"/audit?operation="+opID), chromedp.WaitVisible(`#audit`))
	if n := b.count(`tr[data-operator="olga"][data-action="saga.retry"]`); n != 200 {
		t.Errorf("the audit page shows %d of olga's bulk retry entries, want 200 (100 filed, 100 applied)", n)
	}
	if n := b.count(`tr[data-operator="olga"][data-action="saga.bulk.plan"]`); n != 1 {
		t.Errorf("the audit page shows %d bulk plans by olga, want 1", n)
	}
	reasons, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#audit td.reason")].map(e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reasons {
		if r != "incident 42: stock back" {
			t.Errorf("a bulk entry's reason is %q", r)
			break
		}
	}
	for _, id := range []string{bulk[0], bulk[99]} {
		b.do(chromedp.Navigate(b.base+"/audit?target="+id), chromedp.WaitVisible(`#audit`))
		if n := b.count(`tr[data-operator="olga"][data-action="saga.retry"]`); n != 2 {
			t.Errorf("saga %s: %d audit entries by olga, want 2 (filed, applied)", id, n)
		}
	}

	// Planned by alice, confirmed by bob.
	s.Fix.Store(false)
	more := s.StuckRefunds(t, db, "planned", 5)
	s.Fix.Store(true)
	b.as("alice", "admin")
	b.do(chromedp.Navigate(b.base+"/sagas?"+url.Values{"status": {"stuck"}, "type": {"refund"}}.Encode()), chromedp.WaitVisible(`#bulk-apply`),
		chromedp.SetValue(`#bulk-action`, "retry"), chromedp.SendKeys(`#bulk-reason`, "alice's plan"),
		chromedp.Click(`#bulk-apply`), chromedp.WaitVisible(`#bulk-confirm`))
	confirmURL, err := chromedp.Run(b.ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	b.as("bob", "operator")
	b.do(chromedp.Navigate(confirmURL), chromedp.WaitVisible(`#bulk-confirm`))
	if planner := b.text(`#bulk-planner`); planner != "alice" {
		t.Errorf("bob's confirm page names %q as the planner", planner)
	}
	b.do(chromedp.Click(`#confirm`), chromedp.WaitVisible(`#bulk-confirmer`))
	if c := b.text(`#bulk-confirmer`); c != "bob" {
		t.Errorf("the outcome page names %q as the confirmer", c)
	}
	planID := b.text(`#bulk-id`)
	b.do(chromedp.Navigate(b.base+"/audit?operation="+planID), chromedp.WaitVisible(`#audit`))
	if n := b.count(`tr[data-operator="bob"][data-planner="alice"][data-action="saga.retry"]`); n != len(more) {
		t.Errorf("the audit page shows %d of bob's requests on behalf of alice, want %d", n, len(more))
	}
	if n := b.count(`tr[data-operator="alice"][data-action="saga.bulk.plan"]`); n != 1 {
		t.Errorf("the audit page shows %d plans by alice, want 1", n)
	}
	entries, err := audit.New(db.Schema).List(context.Background(), db.Pool, audit.Filter{Operation: planID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Action == "saga.retry" && (e.Operator != "bob" || e.OnBehalfOf != "alice" || !strings.HasPrefix(e.Source, "console 127.0.0.1")) {
			t.Errorf("entry %+v: want bob on behalf of alice, from the console", e)
		}
	}
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(b.base+"/saga?id="+more[0]), chromedp.WaitVisible(`#history`))
	if n := b.count(`#history small.on-behalf-of`); n < 1 || !strings.Contains(b.text(`#history`), "bob on behalf of alice") {
		t.Errorf("the saga's history does not name bob on behalf of alice:\n%s", b.text(`#history`))
	}
}
