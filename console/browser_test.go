package console_test

import (
	"bytes"
	"context"
	"image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// browser returns the Chromium to drive: CHROMIUM_PATH (which must then
// exist), else the first of chromium, chromium-browser, google-chrome on
// PATH. It skips the test when there is none: scripts/chromium.sh, which
// make test runs first, installs Debian's chromium when it can.
func browser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM_PATH"); p != "" {
		if _, err := exec.LookPath(p); err != nil {
			t.Fatalf("CHROMIUM_PATH=%s: %v", p, err)
		}
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium: run scripts/chromium.sh (as root it installs Debian's chromium) or set CHROMIUM_PATH")
	return ""
}

// TestBrowser drives the console in a real headless Chromium: it requeues
// an outbox dead letter by pressing the buttons (Requeue, then the confirm
// page's "Yes, requeue") and finds it requeued in the database, and it
// checks that the same form without its CSRF token is refused and changes
// nothing; it opens a stuck saga from the sagas page, presses Retry, gives
// a reason and confirms, and finds the saga compensated with the operator
// on record; it opens a compensated saga's page and finds its picture
// drawn, a box per step with its state. With MILLRACE_SCREENSHOT=1 it
// writes docs/console.png (the sagas page) and docs/saga-picture.png (the
// saga's picture).
func TestBrowser(t *testing.T) {
	t.Parallel()
	exe := browser(t)
	db := pgtest.New(t)
	ids := opstest.OutboxDead(t, db, "orders", 3)
	opstest.Write(t, db, "orders", 5) // a backlog for the overview
	opstest.InboxDead(t, db, "billing", 2)
	// Sagas after the dead letters (whose relay would take their commands).
	sagas := opstest.NewSagas(t, db)
	sagas.StuckRefund(t, "order-7f3a")
	sagas.WaitingShip(t, "order-7f3b")
	sagas.StuckRefund(t, "order-7f3c")
	sagas.WaitingShip(t, "order-7f3d")
	sagas.CompensatedBook(t, "order-7f3e")
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	base, ctx := browseConsole(t, exe, db, sagas.O)

	deadLetters := func() []string {
		t.Helper()
		list, err := admin.List(context.Background(), core.ListParams{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, d := range list {
			out = append(out, d.EventID)
		}
		return out
	}

	// Requeue ids[0]: the list's button, then the confirm page's.
	row := `tr[data-event-id="` + ids[0] + `"]`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/outbox/dead"),
		chromedp.WaitVisible(row+` a.button:not(.danger)`),
		chromedp.Click(row+` a.button:not(.danger)`),
		chromedp.WaitVisible(`#confirm`),
	); err != nil {
		t.Fatal(err)
	}
	question, err := chromedp.Run(ctx, chromedp.Text(`.question`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Requeue outbox event " + ids[0] + ", its copy on topic orders?"; question != want {
		t.Errorf("confirm page asks %q, want %q", question, want)
	}
	if got := deadLetters(); len(got) != 3 {
		t.Fatalf("the confirm page changed something: dead letters %v", got)
	}
	if err := chromedp.Do(ctx, chromedp.SendKeys(`#reason`, "broker limit raised"), chromedp.Click(`#confirm`), chromedp.WaitVisible(`#flash`)); err != nil {
		t.Fatal(err)
	}
	flash, err := chromedp.Run(ctx, chromedp.Text(`#flash`))
	if err != nil {
		t.Fatal(err)
	}
	if flash != "Requeued 1 outbox dead letter." {
		t.Errorf("after confirming, the page says %q", flash)
	}
	if got := deadLetters(); slices.Contains(got, ids[0]) || len(got) != 2 {
		t.Errorf("after the browser requeued %s, dead letters are %v", ids[0], got)
	}
	if s, err := admin.Stats(context.Background()); err != nil || s.Pending != 8 {
		t.Errorf("after requeue, stats %+v, %v; want 8 pending (5, the two ship sagas' commands and the requeued one)", s, err)
	}

	// A stuck saga: the sagas page, its row, its page, Retry, a reason,
	// and the confirm button; the saga moves on in the database.
	sagas.Fix.Store(true) // the stock service is fixed: the compensation will go through
	stuck := `tr[data-saga-id="order-7f3c"] a`
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/sagas?status=stuck"),
		chromedp.WaitVisible(stuck),
		chromedp.Click(stuck),
		chromedp.WaitVisible(`#action-retry`),
		chromedp.Click(`#action-retry`),
		chromedp.WaitVisible(`#reason`),
	); err != nil {
		t.Fatal(err)
	}
	if in := sagas.Get(t, "order-7f3c"); in.Status != saga.StatusStuck {
		t.Fatalf("the confirm page changed the saga: %s", in.Status)
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(`#reason`, "stock service fixed"),
		chromedp.Click(`#confirm`),
		chromedp.WaitVisible(`#flash`),
	); err != nil {
		t.Fatal(err)
	}
	status, err := chromedp.Run(ctx, chromedp.Text(`#saga-status`))
	if err != nil {
		t.Fatal(err)
	}
	if in := sagas.Get(t, "order-7f3c"); in.Status != saga.StatusCompensated || status != "compensated" {
		t.Errorf("after the browser's retry the saga is %s (page says %q), want compensated", in.Status, status)
	}
	hist, err := sagas.O.History(context.Background(), "order-7f3c")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(hist, func(h saga.HistoryEntry) bool {
		return h.Event == "operator" && h.Actor == "alice@example.com" && h.Reason == "stock service fixed"
	}) {
		t.Errorf("the browser's retry is not in the saga's history as alice's: %+v", hist)
	}

	// A compensated saga's picture: a box per step, in order, with its
	// state, drawn at a real size.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/saga?id=order-7f3e"),
		chromedp.WaitVisible(`#saga-picture g.step`),
	); err != nil {
		t.Fatal(err)
	}
	boxes, err := chromedp.Run(ctx, chromedp.AttributesAll(`#saga-picture g.step`))
	if err != nil {
		t.Fatal(err)
	}
	var drawn []string
	for _, a := range boxes {
		drawn = append(drawn, a["data-step"]+"="+a["data-state"])
	}
	if want := []string{"reserve_stock=compensated", "reserve_credit=compensated", "charge=failed", "notify=pending"}; !slices.Equal(drawn, want) {
		t.Errorf("the saga picture draws %v, want %v", drawn, want)
	}
	pic, err := chromedp.Run(ctx, chromedp.Screenshot(`figure.picture`))
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(bytes.NewReader(pic)); err != nil || img.Bounds().Dx() < 400 || img.Bounds().Dy() < 100 {
		t.Fatalf("the saga picture does not render at its size: %v", err)
	}
	if os.Getenv("MILLRACE_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("..", "docs", "saga-picture.png"), pic, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The poison-topic page is in the navigation; without Kafka brokers it
	// says it cannot read poison topics.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.Click(`nav a[href$="/poison"]`), chromedp.WaitVisible(`#no-brokers`)); err != nil {
		t.Fatalf("the poison-topic page: %v", err)
	}

	// The screenshot for the docs: the sagas page, stuck, running and
	// compensated ones.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/sagas"), chromedp.WaitVisible(`#sagas`)); err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil || img.Bounds().Dx() < 1000 {
		t.Fatalf("screenshot is not a page-wide PNG: %v", err)
	}
	if os.Getenv("MILLRACE_SCREENSHOT") == "1" {
		if err := os.WriteFile(filepath.Join("..", "docs", "console.png"), shot, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The same form with its CSRF token taken out is refused and changes
	// nothing. Renaming the field (through the DevTools DOM, no script on
	// the page) submits the form without csrf_token.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/outbox/dead/discard?id="+ids[1]),
		chromedp.WaitVisible(`#confirm`),
		chromedp.SendKeys(`#reason`, "obsolete"),
		chromedp.SetAttributeValue(`input[name="csrf_token"]`, "name", "no_token"),
		chromedp.Click(`#confirm`),
		chromedp.WaitVisible(`#error`),
	); err != nil {
		t.Fatal(err)
	}
	refusal, err := chromedp.Run(ctx, chromedp.Text(`#error`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(refusal, "Missing or invalid CSRF token: nothing was changed.") {
		t.Errorf("POST without the token: page says %q", refusal)
	}
	if got := deadLetters(); !slices.Contains(got, ids[1]) || len(got) != 2 {
		t.Errorf("a POST without the CSRF token changed the dead letters: %v", got)
	}
	// And with the token the same page works.
	if err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/outbox/dead/discard?id="+ids[1]),
		chromedp.WaitVisible(`#confirm`),
		chromedp.SendKeys(`#reason`, "obsolete"),
		chromedp.Click(`#confirm`),
		chromedp.WaitVisible(`#flash`),
	); err != nil {
		t.Fatal(err)
	}
	if got := deadLetters(); slices.Contains(got, ids[1]) || len(got) != 1 {
		t.Errorf("after the browser discarded %s, dead letters are %v", ids[1], got)
	}
}

// browseConsole serves a console on db's schema at /ops, acting as
// alice@example.com through orchestrator o, and opens a Chromium tab (exe)
// on it for two minutes at most; it returns the console's base URL and
// the tab. Both close when the test ends.
func browseConsole(t *testing.T, exe string, db *pgtest.DB, o *saga.Orchestrator) (base string, tab context.Context) {
	t.Helper()
	c, err := console.New(db.Pool, console.Config{
		Schema: db.Schema, Prefix: "/ops",
		Authenticate: func(*http.Request) (console.Identity, error) {
			return console.Identity{Name: "alice@example.com", Roles: []string{"admin"}}, nil
		},
		Logger: slog.New(slog.DiscardHandler),
		Sagas:  o,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", c)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox, // as root Chromium refuses to start with its sandbox
		chromedp.Flag("disable-gpu", true),
		chromedp.WindowSize(1360, 820),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	return srv.URL + "/ops", ctx
}
