package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// TestBrowserBulkRetry drives a bulk retry of 1,000 stuck sagas through the
// console in a real headless Chromium: the sagas list filtered by status,
// step and last error offers "apply to all 1000 matching"; the confirm
// page shows the count and the first sagas; one saga changes between that
// page and the confirmation and is refused (changed), not acted on; the
// outcome page shows 999 filed and, once the orchestrator has applied
// them, 999 applied; every saga acted on has alice, the reason and the
// operation in its history.
func TestBrowserBulkRetry(t *testing.T) {
	t.Parallel()
	exe := browser(t)
	db := pgtest.New(t)
	sagas := opstest.NewSagas(t, db)
	ids := sagas.StuckRefunds(t, db, "refund", 1000)
	sagas.WaitingShip(t, "ship-1") // running at step reserve: not selected
	base, ctx := browseConsole(t, exe, db, sagas.O)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("%s: %v", sel, err)
		}
		return s
	}

	// The filter, and "apply to all N matching".
	filter := url.Values{"status": {"stuck"}, "step": {"reserve"}, "error": {"%no such reservation%"}}
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/sagas?"+filter.Encode()),
		chromedp.WaitVisible(`#bulk-apply`),
	); err != nil {
		t.Fatal(err)
	}
	if n := text(`#bulk-count`); n != "1000" {
		t.Fatalf("the sagas list offers to apply to %s matching, want 1000", n)
	}
	if err := chromedp.Do(ctx,
		chromedp.SetValue(`#bulk-action`, "retry"),
		chromedp.SendKeys(`#bulk-reason`, "stock service fixed"),
		chromedp.Click(`#bulk-apply`),
		chromedp.WaitVisible(`#bulk-confirm`),
	); err != nil {
		t.Fatal(err)
	}
	if n := text(`#bulk-selected`); n != "1000" {
		t.Errorf("the confirm page counts %s sagas, want 1000", n)
	}
	pageShot(ctx, t, "bulk-confirm.png")
	rows, err := chromedp.Run(ctx, chromedp.AttributesAll(`#bulk-sample tr[data-saga-id]`))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 20 || rows[0]["data-saga-id"] != ids[0] {
		t.Errorf("the confirm page lists %d sagas starting %v, want the first 20 by id", len(rows), rows)
	}
	for _, id := range []string{ids[0], ids[999]} {
		if in := sagas.Get(t, id); in.Request != nil || in.Status != saga.StatusStuck {
			t.Fatalf("the confirm page changed saga %s: %s, request %+v", id, in.Status, in.Request)
		}
	}

	// Between the confirm page and the confirmation, saga ids[0] is
	// fixed by hand: it changed state, and must be refused.
	sagas.Fix.Store(true)
	if _, err := sagas.O.Retry(context.Background(), ids[0], saga.Actor{Operator: "bob", Reason: "one by hand"}); err != nil {
		t.Fatal(err)
	}
	byHand := sagas.Get(t, ids[0])
	if byHand.Status != saga.StatusCompensated {
		t.Fatalf("the saga fixed by hand is %s", byHand.Status)
	}
	if err := chromedp.Do(ctx, chromedp.Click(`#confirm`), chromedp.WaitVisible(`#bulk-counts`)); err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]string{"#count-selected": "1000", "#count-filed": "999", "#count-pending": "999",
		"#count-refused": "1", `tr[data-reason="changed"] td`: "1", "#count-unfiled": "0"} {
		if got := text(sel); got != want {
			t.Errorf("after confirming, %s says %s, want %s", sel, got, want)
		}
	}
	opID := text(`#bulk-id`)

	// The service's running orchestrator applies the requests.
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := sagas.O.RunDue(context.Background()); err != nil {
			t.Fatal(err)
		}
		b, err := p.BulkStatus(context.Background(), opID)
		if err != nil {
			t.Fatal(err)
		}
		if b.Done() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bulk operation not applied in time: %+v", b.Counts)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(`#bulk-done`)); err != nil {
		t.Fatal(err)
	}
	for sel, want := range map[string]string{"#count-applied": "999", "#count-pending": "0", "#count-refused": "1"} {
		if got := text(sel); got != want {
			t.Errorf("once applied, %s says %s, want %s", sel, got, want)
		}
	}
	pageShot(ctx, t, "bulk-done.png")

	// Every saga acted on is compensated and audited with the operator,
	// the reason and the operation; the one that changed was not acted on.
	var audited, compensated int
	err = db.Pool.QueryRow(context.Background(), `SELECT count(DISTINCT saga_id) FROM `+db.Schema+`.saga_history
 WHERE event = 'operator' AND actor = 'alice@example.com' AND reason = 'stock service fixed' AND detail->>'operation' = $1`, opID).Scan(&audited)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Schema+`.saga_instance
 WHERE id LIKE 'refund-%' AND status = 'compensated'`).Scan(&compensated)
	if err != nil {
		t.Fatal(err)
	}
	if audited != 999 || compensated != 1000 {
		t.Errorf("%d sagas audited as alice's bulk retry (want 999), %d compensated (want 1000)", audited, compensated)
	}
	for _, h := range historyOf(t, sagas.O, ids[0]) {
		if h.Event == "operator" && h.Actor == "alice@example.com" {
			t.Errorf("the saga that changed was acted on: %+v", h)
		}
	}
	if in := sagas.Get(t, ids[0]); in.Revision != byHand.Revision {
		t.Errorf("the saga that changed moved on from revision %d to %d", byHand.Revision, in.Revision)
	}
	refused := false
	for _, h := range historyOf(t, sagas.O, ids[0]) {
		var d struct {
			Operation string `json:"operation"`
		}
		_ = json.Unmarshal(h.Detail, &d)
		refused = refused || (h.Event == "operator_refused" && h.Actor == "alice@example.com" && d.Operation == opID)
	}
	if !refused {
		t.Errorf("the saga that changed has no refusal naming operation %s in its history", opID)
	}
}

func historyOf(t *testing.T, o *saga.Orchestrator, id string) []saga.HistoryEntry {
	t.Helper()
	h, err := o.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// pageShot takes a screenshot of the whole page and checks that it is a
// page-wide PNG; with MILLRACE_SCREENSHOT=1 it writes it to docs/name.
func pageShot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(shot)); err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("screenshot %s is not a page-wide PNG: %v", name, err)
	}
	if os.Getenv("MILLRACE_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("..", "docs", name), shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// An operation larger than the console files in its request is filed in
// the background: the confirmation answers at once, the outcome page says
// the filing goes on, and every saga's request is filed, once.
func TestSagaBulkFiledInTheBackground(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	sagas := opstest.NewSagas(t, db)
	ids := sagas.StuckRefunds(t, db, "refund", 40)
	c, err := console.New(db.Pool, console.Config{Schema: db.Schema, Sagas: sagas.O, Logger: slog.New(slog.DiscardHandler),
		Authenticate: console.ProxyAuth("", "", loopback...)})
	if err != nil {
		t.Fatal(err)
	}
	console.SetBulkInRequest(c, 10)
	b := &bundle{t: t, db: db, logs: &syncBuffer{}}
	b.srv = httptest.NewServer(c)
	t.Cleanup(b.srv.Close)
	b.client = b.newClient()

	token := tokenRE.FindStringSubmatch(b.get("/sagas?status=stuck").body)
	if token == nil {
		t.Fatal("no bulk form on the sagas page")
	}
	r := b.post("/sagas/bulk", url.Values{"csrf_token": {token[1]}, "status": {"stuck"}, "action": {"retry"}, "reason": {"stock service fixed"}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST /sagas/bulk: %d\n%s", r.status, r.body)
	}
	id := regexpFind(t, r.location, `id=([^&]+)`)
	r = b.post("/sagas/bulk/apply", url.Values{"csrf_token": {token[1]}, "id": {id}, "reason": {"stock service fixed"}})
	if r.status != http.StatusSeeOther || !strings.Contains(r.location, "filing=1") {
		t.Fatalf("POST /sagas/bulk/apply: %d to %q\n%s", r.status, r.location, r.body)
	}
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, err := p.BulkStatus(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Counts.Unfiled == 0 {
			if st.Counts.Filed != int64(len(ids)) {
				t.Fatalf("filed %+v, want all %d", st.Counts, len(ids))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not filed in the background: %+v", st.Counts)
		}
		time.Sleep(20 * time.Millisecond)
	}
	page := b.get(strings.TrimPrefix(r.location, b.srv.URL))
	contains(t, "outcome page", page.body, `<td id="count-filed">40</td>`, `<td id="count-unfiled">0</td>`)
	for _, sid := range ids[:3] {
		if in := sagas.Get(t, sid); in.Request == nil || in.Request.Action != saga.ActionRetry {
			t.Errorf("saga %s has no retry request: %+v", sid, in.Request)
		}
	}
}
