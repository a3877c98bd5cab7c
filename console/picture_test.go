package console_test

import (
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

type pictureStep struct {
	Name, State, Group string
	X, Y               int
}

// pictureSteps parses the saga page's picture: each g.step's data
// attributes and its box's position, in document order.
func pictureSteps(t *testing.T, body string) []pictureStep {
	t.Helper()
	i := strings.Index(body, `<svg xmlns="http://www.w3.org/2000/svg" id="saga-picture"`)
	if i < 0 {
		t.Fatalf("the saga page has no picture:\n%s", body)
	}
	j := strings.Index(body[i:], "</svg>")
	dec := xml.NewDecoder(strings.NewReader(body[i : i+j+len("</svg>")]))
	var out []pictureStep
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("the picture is not well-formed SVG: %v\n%s", err, body[i:i+j])
		}
		el, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		attr := map[string]string{}
		for _, a := range el.Attr {
			attr[a.Name.Local] = a.Value
		}
		switch {
		case el.Name.Local == "g" && strings.HasPrefix(attr["class"], "step "):
			if !strings.Contains(" "+attr["class"]+" ", " "+attr["data-state"]+" ") {
				t.Errorf("step %s: class %q lacks its state %q", attr["data-step"], attr["class"], attr["data-state"])
			}
			out = append(out, pictureStep{Name: attr["data-step"], State: attr["data-state"], Group: attr["data-group"]})
		case el.Name.Local == "rect" && len(out) > 0:
			out[len(out)-1].X, _ = strconv.Atoi(attr["x"])
			out[len(out)-1].Y, _ = strconv.Atoi(attr["y"])
		}
	}
}

// The saga page draws every step of the definition in order, a parallel
// group's members in one column, each with its state, attempts and time.
func TestSagaPicture(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	s.CompensatedBook(t, "book-1")

	r := b.get("/saga?id=book-1")
	if r.status != http.StatusOK {
		t.Fatalf("GET saga page: %d\n%s", r.status, r.body)
	}
	steps := pictureSteps(t, r.body)
	want := []pictureStep{
		{Name: "reserve_stock", State: "compensated", Group: "reserve"},
		{Name: "reserve_credit", State: "compensated", Group: "reserve"},
		{Name: "charge", State: "failed"},
		{Name: "notify", State: "pending"},
	}
	if len(steps) != len(want) {
		t.Fatalf("picture has %d steps, want %d: %+v", len(steps), len(want), steps)
	}
	for i, w := range want {
		if g := steps[i]; g.Name != w.Name || g.State != w.State || g.Group != w.Group {
			t.Errorf("step %d: %+v, want %+v", i, g, w)
		}
	}
	// The group side by side (one column, two rows), then one column each.
	if steps[0].X != steps[1].X || steps[0].Y == steps[1].Y {
		t.Errorf("group members not in one column: %+v %+v", steps[0], steps[1])
	}
	if !(steps[1].X < steps[2].X && steps[2].X < steps[3].X) {
		t.Errorf("columns not left to right: %+v", steps)
	}
	contains(t, "picture", r.body,
		`<text class="detail" x="`, `attempt 1 · comp 1 · `, // action and compensation attempts, time taken
		`<title>reserve_credit (group reserve): compensated, attempt 1 · comp 1, took `,
		`<title>notify: pending, attempt 0, took -</title>`,
		`In definition order`)

	// A console without the definition draws the steps that started, one
	// column each, and says so.
	b2 := setupOn(t, b.db, console.Config{})
	r = b2.get("/saga?id=book-1")
	steps = pictureSteps(t, r.body)
	if len(steps) != 3 || steps[0].X >= steps[1].X || steps[1].X >= steps[2].X {
		t.Errorf("picture without the definition: %+v, want the three started steps in a row", steps)
	}
	for _, st := range steps {
		if st.Name == "notify" || st.State == "pending" {
			t.Errorf("picture without the definition draws a step that never started: %+v", st)
		}
	}
	contains(t, "picture without the definition", r.body, "does not have the saga's definition: the steps that started")
}

// The overview charts sagas started, completed, compensated and stuck per
// minute over the last hour, and the oldest pending event's age.
func TestOverviewCharts(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	b := setupOn(t, db, console.Config{Sagas: s.O})
	s.StuckRefund(t, "refund-1")
	s.StuckRefund(t, "refund-2")
	s.WaitingShip(t, "ship-1")
	s.CompensatedBook(t, "book-1")
	// A saga that completed half an hour ago, and one from two hours ago
	// (outside the window).
	hist := sqlident.Table(db.Schema, "saga_history")
	if _, err := db.Pool.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (saga_id, at, event) VALUES
	  ('old-1', date_trunc('minute', now()) - interval '30 minutes' + interval '20 seconds', 'completed'),
	  ('old-2', now() - interval '2 hours', 'completed')`, hist)); err != nil {
		t.Fatal(err)
	}
	opstest.Write(t, db, "orders", 1)

	r := b.get("/")
	if r.status != http.StatusOK {
		t.Fatalf("GET /: %d\n%s", r.status, r.body)
	}
	for series, n := range map[string]int{"started": 4, "completed": 1, "compensated": 1, "stuck": 2} {
		contains(t, "overview", r.body, fmt.Sprintf(`<span class="value" id="chart-total-%s">%d</span>`, series, n))
		sum := 0
		for _, m := range barsOf(t, r.body, series) {
			sum += m
		}
		if sum != n {
			t.Errorf("chart %s: bars add up to %d, want %d", series, sum, n)
		}
	}
	// The completed saga's bar is half an hour back (31 if the minute
	// turned between the insert and the request).
	if !regexp.MustCompile(`data-minutes-ago="3[01]" data-n="1"`).MatchString(chartOf(t, r.body, "completed")) {
		t.Errorf("completed chart has no bar 30 minutes ago:\n%s", chartOf(t, r.body, "completed"))
	}
	// This minute's starts (or the last two minutes', across a turn).
	if !regexp.MustCompile(`data-minutes-ago="[01]" data-n="[1-4]"`).MatchString(chartOf(t, r.body, "started")) {
		t.Errorf("started chart has no bar for now:\n%s", chartOf(t, r.body, "started"))
	}
	if !regexp.MustCompile(`<svg [^>]*id="oldest-gauge"[^>]*data-seconds="\d+"`).MatchString(r.body) {
		t.Errorf("no oldest-pending gauge:\n%s", r.body)
	}
}

func chartOf(t *testing.T, body, series string) string {
	t.Helper()
	i := strings.Index(body, `id="chart-`+series+`"`)
	if i < 0 {
		t.Fatalf("no chart %s in\n%s", series, body)
	}
	return body[i : i+strings.Index(body[i:], "</svg>")]
}

func barsOf(t *testing.T, body, series string) []int {
	t.Helper()
	var out []int
	for _, m := range regexp.MustCompile(`<rect class="bar" [^>]*data-n="(\d+)"`).FindAllStringSubmatch(chartOf(t, body, series), -1) {
		n, _ := strconv.Atoi(m[1])
		out = append(out, n)
	}
	return out
}

// A child step's box links to its child saga, the page lists the
// children, and a child's page links to its parent.
func TestSagaPageLinksParentAndChildren(t *testing.T) {
	t.Parallel()
	b, s := setupSagas(t, console.Config{})
	s.ShippingParent(t, "trip-1")

	r := b.get("/saga?id=trip-1")
	if r.status != http.StatusOK {
		t.Fatalf("GET saga page: %d\n%s", r.status, r.body)
	}
	if steps := pictureSteps(t, r.body); len(steps) != 1 || steps[0].Name != "shipping" || steps[0].State != "running" {
		t.Fatalf("picture %+v", steps)
	}
	contains(t, "parent page", r.body, `data-child="trip-1/shipping/1"`, `class="child-link"`, `child saga ↗`,
		`<h2>Child sagas</h2>`, `<tr data-child="trip-1/shipping/1">`)
	r = b.get("/saga?id=" + url.QueryEscape("trip-1/shipping/1"))
	if r.status != http.StatusOK {
		t.Fatalf("GET child page: %d\n%s", r.status, r.body)
	}
	contains(t, "child page", r.body, `<a id="saga-parent" href="`, `>trip-1</a>`)
	if strings.Contains(r.body, "<h2>Child sagas</h2>") {
		t.Error("the child lists children")
	}
}
