package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// navItem is an entry of the navigation bar. A page is one template in
// templates/ (defining "content"), one handler, and one navItem; Soon
// marks an entry whose page is not there yet.
type navItem struct {
	Key, Label, Path, Soon string
}

var nav = []navItem{
	{Key: "overview", Label: "Overview", Path: "/"},
	{Key: "outbox", Label: "Outbox dead letters", Path: "/outbox/dead"},
	{Key: "inbox", Label: "Inbox dead letters", Path: "/inbox/dead"},
	{Key: "sagas", Label: "Sagas", Path: "/sagas"},
	{Key: "poison", Label: "Poison topics", Path: "/poison"},
	{Key: "lag", Label: "Consumer lag", Path: "/kafka/lag"},
	{Key: "audit", Label: "Audit", Path: "/audit"},
}

// view is what every page template gets: the layout's fields and the
// page's own Data.
type view struct {
	Title    string
	Active   string // navItem.Key
	Nav      []navItem
	Prefix   string
	CSRF     string
	ReadOnly bool
	Operator string
	Roles    []string
	Flash    string
	Data     any
	// Services are the services of a console over several, for the
	// navigation (nil for one service); Root is the path of their
	// overview.
	Services []serviceLink
	Root     string
}

var funcs = template.FuncMap{
	"since": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return human(time.Since(t))
	},
	"human": human,
	// operatorAction is the action of an operator history line.
	"operatorAction": func(h saga.HistoryEntry) string {
		var d struct{ Action string }
		if h.Event != "operator" && h.Event != "operator_request" && h.Event != "operator_refused" || json.Unmarshal(h.Detail, &d) != nil {
			return ""
		}
		return actionLabel(d.Action)
	},
	// onBehalfOf is the planner of the bulk operation an operator
	// history line carries out, when someone else confirmed it.
	"onBehalfOf": func(h saga.HistoryEntry) string {
		var d struct {
			OnBehalfOf string `json:"on_behalf_of"`
		}
		if !strings.HasPrefix(h.Event, "operator") || json.Unmarshal(h.Detail, &d) != nil {
			return ""
		}
		return d.OnBehalfOf
	},
	// arrivedAt is when an event line's event arrived, when that is not
	// when the line was written (it waited: held for a paused saga,
	// stored before its wait); zero otherwise.
	"arrivedAt": func(h saga.HistoryEntry) time.Time {
		var d struct {
			At time.Time `json:"arrived_at"`
		}
		if h.Event != "event" || json.Unmarshal(h.Detail, &d) != nil || d.At.Equal(h.At) {
			return time.Time{}
		}
		return d.At
	},
	"actionLabel": actionLabel,
	"add":         func(a, b int) int { return a + b },
	"seconds":     func(d time.Duration) int64 { return int64(d / time.Second) },
	"stamp": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"stampp": func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"short": func(s string, n int) string {
		if r := []rune(s); len(r) > n {
			return string(r[:n-1]) + "…"
		}
		return s
	},
}

// human prints a duration for people: 12s, 4m12s, 2h5m, 3d4h.
func human(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// parseTemplates makes one template set per page: the layout plus the
// page's file.
func (c *Console) parseTemplates() error {
	base, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return err
	}
	c.pages = map[string]*template.Template{}
	for _, page := range []string{"overview", "outbox_dead", "inbox_dead", "confirm", "error", "sagas", "saga", "saga_confirm", "saga_bulk", "dead_bulk", "poison", "kafka_lag", "services", "audit"} {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+page+".html")
		if err != nil {
			return err
		}
		c.pages[page] = t
	}
	return nil
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page, title, active string, data any) {
	v := view{
		Title: title, Active: active, Nav: nav, Prefix: c.cfg.Prefix,
		CSRF: c.csrf.token(w, r, identity(r).Name), ReadOnly: c.cfg.ReadOnly, Operator: identity(r).Name, Roles: identity(r).Roles,
		Flash: flash(r.URL.Query()), Data: data,
	}
	if c.set != nil {
		v.Services, v.Root = c.set.links(c.service), c.set.prefix+"/"
		if c.service == "" {
			v.Nav = nil // the services' overview has no pages of its own
		}
	}
	var b strings.Builder
	if err := c.pages[page].ExecuteTemplate(&b, "layout", v); err != nil {
		c.log.Error("console: render "+page, "err", err)
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail shows an error page; nothing was changed.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	c.render(w, r, status, "error", http.StatusText(status), "", struct {
		Status  int
		Message string
	}{status, msg})
}

// dbFail shows a database error, logged with the request path.
func (c *Console) dbFail(w http.ResponseWriter, r *http.Request, err error) {
	c.log.Error("console: database", "err", err, "path", r.URL.Path)
	c.fail(w, r, http.StatusInternalServerError, "Database error: "+err.Error())
}

// flash is the message after an action's redirect, made from fixed
// wording and a count, never from text in the URL.
func flash(q url.Values) string {
	if f := sagaFlash(q); f != "" {
		return f
	}
	n, err := strconv.Atoi(q.Get("n"))
	if err != nil || n < 0 {
		return ""
	}
	what := map[string]string{"outbox": "outbox dead letter", "inbox": "inbox dead letter", "poison": "poisoned message"}[q.Get("kind")]
	verb := map[string]string{"requeue": "Requeued", "discard": "Discarded"}[q.Get("done")]
	if what == "" || verb == "" {
		return ""
	}
	if n != 1 {
		what += "s"
	}
	msg := fmt.Sprintf("%s %d %s.", verb, n, what)
	if k, err := strconv.Atoi(q.Get("refused")); err == nil && k > 0 {
		msg += fmt.Sprintf(" Refused %d: not a Watermill message, or it does not say its original topic.", k)
	}
	return msg
}

type consumerRow struct {
	Consumer string
	Dead     int64
	More     bool // Dead is the cap: there are more
}

type overviewData struct {
	Stats     outbox.Stats
	Consumers []consumerRow
	CountCap  int
	// Sagas counts the live and stuck sagas by status, each up to
	// CountCap (More: there are more).
	Sagas []statusCount
	// Charts are sagas started, completed, compensated and stuck per
	// minute over the last hour; Backlog the oldest pending event's age
	// (its current value: no history of it is kept).
	Charts  []sagaChart
	Backlog ageGauge
}

type statusCount struct {
	Status string
	N      int64
	More   bool
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	if !c.allow(w, r, "read", Resource{Kind: "overview"}) {
		return
	}
	d, err := c.overviewData(r)
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", "overview", d)
}

// overviewData reads the overview's figures: the outbox's, the inboxes'
// dead letters, the sagas by status and the last hour's charts.
func (c *Console) overviewData(r *http.Request) (overviewData, error) {
	ctx, cancel := reqCtx(r)
	defer cancel()
	stats, err := c.outbox.Stats(ctx)
	if err != nil {
		return overviewData{}, err
	}
	consumers, err := c.consumers(r)
	if err != nil {
		return overviewData{}, err
	}
	d := overviewData{Stats: stats, Consumers: consumers, CountCap: c.cfg.PageSize}
	for _, st := range []string{"stuck", "running", "compensating"} {
		var n int64
		if err := c.pool.QueryRow(ctx, c.sagaCountSQL, st, c.cfg.PageSize+1).Scan(&n); err != nil {
			return overviewData{}, err
		}
		sc := statusCount{Status: st, N: n}
		if n > int64(c.cfg.PageSize) {
			sc.N, sc.More = int64(c.cfg.PageSize), true
		}
		d.Sagas = append(d.Sagas, sc)
	}
	since := time.Now().Truncate(time.Minute).Add(-(chartMinutes - 1) * time.Minute)
	counts, err := c.sagaCounts(ctx, since)
	if err != nil {
		return overviewData{}, err
	}
	d.Charts, d.Backlog = sagaCharts(counts, since), backlogGauge(stats.OldestPendingAge)
	return d, nil
}

// sagaCounts returns, per chart series, the sagas per minute since since
// (index 0 is the minute starting at since), from one query.
func (c *Console) sagaCounts(ctx context.Context, since time.Time) (map[string][]int64, error) {
	rows, err := c.pool.Query(ctx, c.sagaChartSQL, since)
	if err != nil {
		return nil, fmt.Errorf("count sagas per minute: %w", err)
	}
	defer rows.Close()
	out := map[string][]int64{}
	for _, s := range chartSeries {
		out[s] = make([]int64, chartMinutes)
	}
	for rows.Next() {
		var minute time.Time
		var event string
		var n int64
		if err := rows.Scan(&minute, &event, &n); err != nil {
			return nil, fmt.Errorf("count sagas per minute: %w", err)
		}
		if i := int(minute.Sub(since) / time.Minute); i >= 0 && i < chartMinutes && out[event] != nil {
			out[event][i] += n
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count sagas per minute: %w", err)
	}
	return out, nil
}

// consumers returns the configured inbox consumers, or those with dead
// letters, each with its dead-letter count up to PageSize.
func (c *Console) consumers(r *http.Request) ([]consumerRow, error) {
	ctx, cancel := reqCtx(r)
	defer cancel()
	names := c.cfg.InboxConsumers
	if names == nil {
		rows, err := c.pool.Query(ctx, c.consumersSQL)
		if err != nil {
			return nil, fmt.Errorf("list inbox consumers: %w", err)
		}
		if names, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("list inbox consumers: %w", err)
		}
	}
	out := make([]consumerRow, 0, len(names))
	for _, name := range names {
		var n int64
		if err := c.pool.QueryRow(ctx, c.consumerDeadSQL, name, c.cfg.PageSize+1).Scan(&n); err != nil {
			return nil, fmt.Errorf("count dead letters of %s: %w", name, err)
		}
		row := consumerRow{Consumer: name, Dead: n}
		if n > int64(c.cfg.PageSize) {
			row.Dead, row.More = int64(c.cfg.PageSize), true
		}
		out = append(out, row)
	}
	return out, nil
}

type outboxDeadData struct {
	Topic, Key string
	// Error and Older narrow the list by last error and age (deadbulk.go).
	Error, Older string
	After        int64
	List         []outbox.DeadLetter
	Next         int64 // AfterID of the next page, 0 when this is the last
	// Matching is how many dead letters the filter selects, for "requeue
	// or discard all N matching"; -1 when it offers none.
	Matching int
	Filter   deadFilter
	deadActions
}

// deadActions say which buttons a dead-letter page draws, and what of
// each dead letter's payload it shows (by its row id).
type deadActions struct {
	CanRequeue, CanDiscard bool
	Payloads               map[int64]shown
}

// deadActions are what r's identity may do on kind's dead letters (of
// consumer, an inbox), and sees of their payloads.
func (c *Console) deadActions(r *http.Request, kind, consumer string) deadActions {
	res := Resource{Kind: kind, Type: consumer}
	return deadActions{CanRequeue: c.can(r, "requeue", res), CanDiscard: c.can(r, "discard", res), Payloads: map[int64]shown{}}
}

func (c *Console) outboxDead(w http.ResponseWriter, r *http.Request) {
	if !c.allow(w, r, "read", Resource{Kind: "outbox"}) {
		return
	}
	q := r.URL.Query()
	f, ok := c.readFilter(w, r, "outbox", q.Get)
	if !ok {
		return
	}
	d := outboxDeadData{Topic: f.Topic, Key: f.Key, Error: f.Error, Older: f.Older, Matching: -1, Filter: f,
		deadActions: c.deadActions(r, "outbox", "")}
	if s := q.Get("after"); s != "" {
		after, err := strconv.ParseInt(s, 10, 64)
		if err != nil || after < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Bad page: after=%q is not a row id.", s))
			return
		}
		d.After = after
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	if f.selected() {
		dry, err := c.outbox.DryRun(ctx, f.deadQuery(), c.cfg.PageSize)
		if err != nil {
			c.dbFail(w, r, err)
			return
		}
		if d.CanRequeue || d.CanDiscard {
			d.Matching = dry.Count
		}
		if d.Error != "" || d.Older != "" { // the listing cannot filter these: show the first matching
			d.List = dry.First
			c.outboxPayloads(r, &d)
			c.render(w, r, http.StatusOK, "outbox_dead", "Outbox dead letters", "outbox", d)
			return
		}
	}
	// One more than a page says whether a next page exists.
	list, err := c.outbox.List(ctx, core.ListParams{
		Limit: c.cfg.PageSize + 1, AfterID: d.After, Topic: d.Topic, PartitionKey: d.Key,
	})
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	if len(list) > c.cfg.PageSize {
		list = list[:c.cfg.PageSize]
		d.Next = list[len(list)-1].ID
	}
	d.List = list
	c.outboxPayloads(r, &d)
	c.render(w, r, http.StatusOK, "outbox_dead", "Outbox dead letters", "outbox", d)
}

// outboxPayloads fills in what r's identity sees of the listed payloads.
func (c *Console) outboxPayloads(r *http.Request, d *outboxDeadData) {
	for _, e := range d.List {
		d.Payloads[e.ID] = c.show(r, Resource{Kind: "outbox", Type: e.Topic, ID: e.EventID}, e.Payload)
	}
}

type inboxDeadData struct {
	Consumer  string
	Consumers []consumerRow
	List      []inbox.DeadLetter
	More      bool
	// Filter narrows the list (deadbulk.go); Matching is how many dead
	// letters it selects, for "requeue or discard all N matching", -1 when
	// it offers none.
	Filter   deadFilter
	Matching int
	deadActions
}

func (c *Console) inboxDead(w http.ResponseWriter, r *http.Request) {
	f, ok := c.readFilter(w, r, "inbox", r.URL.Query().Get)
	if !ok || !c.allow(w, r, "read", Resource{Kind: "inbox", Type: f.Consumer}) {
		return
	}
	d := inboxDeadData{Consumer: f.Consumer, Filter: f, Matching: -1, deadActions: c.deadActions(r, "inbox", f.Consumer)}
	if d.Consumer == "" {
		consumers, err := c.consumers(r)
		if err != nil {
			c.dbFail(w, r, err)
			return
		}
		d.Consumers = consumers
		c.render(w, r, http.StatusOK, "inbox_dead", "Inbox dead letters", "inbox", d)
		return
	}
	dl, err := inbox.NewDeadLetters(c.pool, inbox.DeadLetterConfig{Schema: c.schema, Consumer: d.Consumer})
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	if f.selected() {
		dry, err := dl.DryRun(ctx, f.deadQuery(), c.cfg.PageSize)
		if err != nil {
			c.dbFail(w, r, err)
			return
		}
		if d.CanRequeue || d.CanDiscard {
			d.Matching = dry.Count
		}
		d.List, d.More = dry.First, dry.Count > len(dry.First)
		c.inboxPayloads(r, &d)
		c.render(w, r, http.StatusOK, "inbox_dead", "Inbox dead letters: "+d.Consumer, "inbox", d)
		return
	}
	list, err := dl.List(ctx, core.ListParams{Limit: c.cfg.PageSize + 1})
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	if len(list) > c.cfg.PageSize {
		list, d.More = list[:c.cfg.PageSize], true
	}
	d.List = list
	c.inboxPayloads(r, &d)
	c.render(w, r, http.StatusOK, "inbox_dead", "Inbox dead letters: "+d.Consumer, "inbox", d)
}

// inboxPayloads fills in what r's identity sees of the listed payloads.
func (c *Console) inboxPayloads(r *http.Request, d *inboxDeadData) {
	for _, e := range d.List {
		d.Payloads[e.ID] = c.show(r, Resource{Kind: "inbox", Type: d.Consumer, ID: e.EventID}, e.Payload)
	}
}

// confirmData is the confirm page: what will happen, and the form that
// does it.
type confirmData struct {
	Kind     string // outbox, inbox
	Action   string // requeue, discard
	Consumer string // inbox only
	EventID  string
	// Topic is the outbox copy's topic: an event written to several
	// topics has a dead letter per copy, and the page's buttons act on
	// the one shown. Empty (a hand-made URL): every copy of the id.
	Topic    string
	Question string
	Effect   string
	Post     string // form action, under the prefix
	Cancel   string
}

var effects = map[string]string{
	"outbox/requeue": "The relay publishes it again, starting from its first attempt; its last error stays on record.",
	"outbox/discard": "It is never published; later events of its partition key flow again. This cannot be undone.",
	"inbox/requeue":  "The processor runs the handler again, with its attempts back at zero.",
	"inbox/discard":  "It is marked processed without running the handler, and no longer holds its key. This cannot be undone.",
}

// target reads and checks the action and event id of a confirm page or an
// action; it writes the error page and returns false when they are bad.
func (c *Console) target(w http.ResponseWriter, r *http.Request, kind string) (confirmData, bool) {
	d := confirmData{Kind: kind, Action: r.PathValue("action")}
	if _, ok := effects[kind+"/"+d.Action]; !ok {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("Unknown action %q: nothing was changed.", d.Action))
		return d, false
	}
	raw := r.FormValue("id")
	id, err := uuid.Parse(raw)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Event id %q is not a UUID: nothing was changed.", raw))
		return d, false
	}
	d.EventID = id.String()
	if kind == "outbox" {
		d.Topic = r.FormValue("topic")
	}
	if kind == "inbox" {
		d.Consumer = r.FormValue("consumer")
		if d.Consumer == "" {
			c.fail(w, r, http.StatusBadRequest, "No consumer given: nothing was changed.")
			return d, false
		}
	}
	return d, true
}

func (c *Console) confirm(w http.ResponseWriter, r *http.Request, kind string) {
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "The console is read-only.")
		return
	}
	d, ok := c.target(w, r, kind)
	if !ok || !c.allow(w, r, Action(d.Action), Resource{Kind: kind, Type: d.Consumer, ID: d.EventID}) {
		return
	}
	d.Effect = effects[kind+"/"+d.Action]
	d.Post = c.cfg.Prefix + "/" + kind + "/dead/" + d.Action
	verb := strings.ToUpper(d.Action[:1]) + d.Action[1:]
	if kind == "outbox" {
		d.Question = fmt.Sprintf("%s outbox event %s?", verb, d.EventID)
		if d.Topic != "" {
			d.Question = fmt.Sprintf("%s outbox event %s, its copy on topic %s?", verb, d.EventID, d.Topic)
		}
		d.Cancel = c.cfg.Prefix + "/outbox/dead"
	} else {
		d.Question = fmt.Sprintf("%s the message %s of consumer %s?", verb, d.EventID, d.Consumer)
		d.Cancel = c.cfg.Prefix + "/inbox/dead?consumer=" + url.QueryEscape(d.Consumer)
	}
	c.render(w, r, http.StatusOK, "confirm", "Confirm: "+d.Action, kind, d)
}

func (c *Console) outboxConfirm(w http.ResponseWriter, r *http.Request) { c.confirm(w, r, "outbox") }
func (c *Console) inboxConfirm(w http.ResponseWriter, r *http.Request)  { c.confirm(w, r, "inbox") }

func (c *Console) outboxAct(w http.ResponseWriter, r *http.Request) (string, bool) {
	d, ok := c.target(w, r, "outbox")
	if !ok || !c.allow(w, r, Action(d.Action), Resource{Kind: "outbox", ID: d.EventID}) {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	var n int
	var err error
	if d.Topic != "" {
		// The copy shown: its event id and topic, as the bulk actions
		// select rows.
		act := c.outbox.RequeueMatching
		if d.Action == "discard" {
			act = c.outbox.DiscardMatching
		}
		n, err = act(ctx, core.DeadLetterQuery{EventID: d.EventID, Topic: d.Topic}, actor(r, reason))
	} else {
		act := c.outbox.Requeue
		if d.Action == "discard" {
			act = c.outbox.Discard
		}
		n, err = act(ctx, actor(r, reason), d.EventID)
	}
	return c.acted(w, r, d, n, err, "/outbox/dead?")
}

// reason is the reason a form gives for its action; without one the
// action is refused (400) and reason reports false.
func (c *Console) reason(w http.ResponseWriter, r *http.Request) (string, bool) {
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		c.fail(w, r, http.StatusBadRequest, "A reason is required (it is recorded in the audit trail): nothing was changed.")
		return "", false
	}
	return reason, true
}

func (c *Console) inboxAct(w http.ResponseWriter, r *http.Request) (string, bool) {
	d, ok := c.target(w, r, "inbox")
	if !ok || !c.allow(w, r, Action(d.Action), Resource{Kind: "inbox", Type: d.Consumer, ID: d.EventID}) {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	dl, err := inbox.NewDeadLetters(c.pool, inbox.DeadLetterConfig{Schema: c.schema, Consumer: d.Consumer})
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, err.Error())
		return "", false
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	act := dl.Requeue
	if d.Action == "discard" {
		act = dl.Discard
	}
	n, err := act(ctx, actor(r, reason), d.EventID)
	return c.acted(w, r, d, n, err, "/inbox/dead?consumer="+url.QueryEscape(d.Consumer)+"&")
}

// acted logs an action's outcome with the operator and says where to go.
func (c *Console) acted(w http.ResponseWriter, r *http.Request, d confirmData, n int, err error, back string) (string, bool) {
	attrs := []any{"operator", identity(r).Name, "action", d.Action, "kind", d.Kind, "event_id", d.EventID,
		"reason", r.PostFormValue("reason")}
	if d.Consumer != "" {
		attrs = append(attrs, "consumer", d.Consumer)
	}
	if err != nil {
		c.log.Error("console: "+d.Kind+" dead letter "+d.Action+" failed", append(attrs, "err", err)...)
		c.fail(w, r, http.StatusInternalServerError, "Database error: "+err.Error())
		return "", false
	}
	if n == 0 {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("Event %s is not an %s dead letter (unknown, or already requeued or discarded): nothing was changed.", d.EventID, d.Kind))
		return "", false
	}
	done := map[string]string{"requeue": "requeued", "discard": "discarded"}[d.Action]
	c.log.Info("console: "+d.Kind+" dead letter "+done, append(attrs, "count", n)...)
	return fmt.Sprintf("%skind=%s&done=%s&n=%d", back, d.Kind, d.Action, n), true
}
