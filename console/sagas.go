package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

var sagaStatuses = []saga.Status{saga.StatusStuck, saga.StatusRunning, saga.StatusCompensating, saga.StatusCompleted, saga.StatusCompensated,
	saga.StatusPaused, saga.StatusScheduled}

// sagaEffects says what each operator action does, on its confirm page.
var sagaEffects = map[string]string{
	"retry":            "The current step's action (or, while compensating, its compensation) is sent again now, with a new attempt number and a fresh retry budget.",
	"skip":             "The current step is treated as done by hand, without running it, and the saga moves on to its next step.",
	"mark-compensated": "The current step's compensation is treated as done by hand, and the saga goes on compensating the steps before it.",
	"abort":            "The saga stops going forward and compensates the steps that took effect (a scheduled saga is cancelled: it never starts). This cannot be undone.",
	"pause":            "The saga takes no next step and fires no timer until it is resumed. Replies that arrive meanwhile are kept and applied, in order, on resume.",
	"resume":           "The saga goes on where it stood. Its current step's timeout and its deadline move later by the time it was paused, and the replies kept meanwhile are applied in order.",
	"withdraw":         "The saga's pending operator request is withdrawn: the service's orchestrator will not apply it. Nothing else changes.",
	"signal":           "The event is delivered to the saga as its sender would have: applied once per event id, kept until the saga reaches the step waiting for it, refused (and recorded) if the saga has ended or no step waits for it.",
}

var sagaActionOrder = []string{"retry", "skip", "mark-compensated", "abort", "pause", "resume"}

type sagaListData struct {
	Type, Status, Older string
	Step, Error         string
	// Attrs are the attribute filters (saga.ListParams.Attrs).
	Attrs []string
	// Matching is how many sagas the filter selects, for "apply to all N
	// matching" (bulk.go); -1 when it offers none.
	Matching     int64
	Actions      []string
	Statuses     []saga.Status
	List         []*saga.Instance
	Cursor, Next string
	Filtered     bool
}

// sagaList lists sagas by type, status and age, newest first, a page at a
// time (saga.Orchestrator.List: a keyset over the indexes of migration
// 005).
func (c *Console) sagaList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := sagaListData{Type: q.Get("type"), Status: q.Get("status"), Older: q.Get("older"), Cursor: q.Get("cursor"), Statuses: sagaStatuses,
		Step: q.Get("step"), Error: q.Get("error"), Attrs: attrFilters(q), Actions: sagaActionOrder}
	if !c.allow(w, r, "read", Resource{Kind: "saga", Type: d.Type}) {
		return
	}
	d.Actions = slices.DeleteFunc(slices.Clone(sagaActionOrder), func(a string) bool {
		return !c.can(r, "act-bulk", Resource{Kind: "saga", Type: d.Type, Op: a})
	})
	d.Filtered = d.Type != "" || d.Status != "" || d.Older != "" || d.Step != "" || d.Error != "" || len(d.Attrs) > 0
	p := saga.ListParams{Type: d.Type, Cursor: d.Cursor, Limit: c.cfg.PageSize, Step: d.Step, Error: d.Error, Attrs: d.Attrs}
	if d.Status != "" {
		ok := false
		for _, s := range sagaStatuses {
			ok = ok || string(s) == d.Status
		}
		if !ok {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Unknown status %q.", d.Status))
			return
		}
		p.Status = saga.Status(d.Status)
	}
	if d.Older != "" {
		age, err := time.ParseDuration(d.Older)
		if err != nil || age < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Bad age %q: write it like 30m, 2h or 48h.", d.Older))
			return
		}
		p.CreatedBefore = time.Now().Add(-age)
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	res, err := c.sagas.List(ctx, p)
	if errors.Is(err, saga.ErrInvalidCursor) {
		c.fail(w, r, http.StatusBadRequest, "Bad page cursor: start from the first page.")
		return
	}
	if errors.Is(err, core.ErrInvalidListParams) {
		c.fail(w, r, http.StatusBadRequest, "Bad attribute filter: "+err.Error()+". Write it like customer=ada, amount>100 or due<2026-01-31.")
		return
	}
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	d.List, d.Next = res.Sagas, res.Next
	bq, _ := c.sagaQuery(w, r, q) // checked above
	if d.Matching, err = c.bulkCount(ctx, bq); err != nil {
		c.dbFail(w, r, err)
		return
	}
	if len(d.Actions) == 0 {
		d.Matching = -1 // nothing this identity may do in bulk
	}
	c.render(w, r, http.StatusOK, "sagas", "Sagas", "sagas", d)
}

// NextQuery is the query string of the next page, filters kept.
func (d sagaListData) NextQuery() template.URL {
	return d.query(d.Next)
}

// FirstQuery is the query string of the first page, filters kept.
func (d sagaListData) FirstQuery() template.URL {
	return d.query("")
}

func (d sagaListData) query(cursor string) template.URL {
	v := url.Values{"attr": d.Attrs}
	for k, s := range map[string]string{"type": d.Type, "status": d.Status, "older": d.Older, "step": d.Step, "error": d.Error, "cursor": cursor} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return template.URL(v.Encode()) // encoded: only its own escapes
}

type stepRow struct {
	Name    string
	State   *saga.StepState
	Current bool
}

type sagaPageData struct {
	Saga *saga.Instance
	// Data is the saga's data as this identity is shown it (Config.Redact).
	Data    shown
	Steps   []stepRow
	History []saga.HistoryEntry
	Actions []string
	Ended   bool
	// Outcome is, for an ended saga, why it ended so: for a compensated
	// one the failure that started the compensation. An ended saga's
	// LastError may still hold a reason an operator has since fixed (it
	// is in the history, with the fix).
	Outcome string
	// Requests: actions are recorded as operator requests.
	Requests bool
	// CanWithdraw: this identity may withdraw the pending request.
	CanWithdraw bool
	// CanSignal: the saga has not ended and this identity may send it an
	// event (saga.Orchestrator.Signal); Waiting: its current step waits
	// for one.
	CanSignal, Waiting bool
	// EventID is a new event id for the form: sending it twice (a
	// double click, a reload) applies it once.
	EventID string
	// Picture draws the steps (nil when there are none to draw).
	Picture *sagaPicture
	// Stalled is set when the command the saga waits on sits on a
	// partition nobody consumes (see lagPage); nil otherwise.
	Stalled *stalledCommand
	// Children are the sagas its child steps started, newest first.
	Children []*saga.Instance
}

func (c *Console) sagaPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		c.fail(w, r, http.StatusBadRequest, "No saga id given.")
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	in, err := c.sagas.Get(ctx, id)
	if errors.Is(err, saga.ErrNotFound) {
		if c.allow(w, r, "read", Resource{Kind: "saga", ID: id}) {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No saga %q.", id))
		}
		return
	}
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	res := Resource{Kind: "saga", Type: in.Type, ID: in.ID}
	if !c.allow(w, r, "read", res) {
		return
	}
	hist, err := c.sagas.History(ctx, id)
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	d := sagaPageData{Saga: in, History: hist, Data: c.show(r, res, in.Data),
		Ended: in.Status == saga.StatusCompleted || in.Status == saga.StatusCompensated, Requests: c.requests != nil,
		CanWithdraw: c.can(r, "act", Resource{Kind: "saga", Type: in.Type, ID: in.ID, Op: "withdraw"})}
	names := make([]string, 0, len(in.Steps))
	for name := range in.Steps {
		names = append(names, name)
	}
	// Steps in the order they were first sent (the stored state is keyed by
	// name; the definition's order is in the user's Go code).
	sort.Slice(names, func(i, j int) bool {
		a, b := in.Steps[names[i]].StartedAt, in.Steps[names[j]].StartedAt
		switch {
		case a != nil && b != nil && !a.Equal(*b):
			return a.Before(*b)
		case (a == nil) != (b == nil):
			return a != nil
		}
		return names[i] < names[j]
	})
	for _, name := range names {
		d.Steps = append(d.Steps, stepRow{Name: name, State: in.Steps[name], Current: name == in.Step})
	}
	kids, err := c.sagas.List(ctx, saga.ListParams{Parent: in.ID, Limit: 100})
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	d.Children = kids.Sagas
	d.CanSignal = !d.Ended && c.can(r, "act", Resource{Kind: "saga", Type: in.Type, ID: in.ID, Op: "signal"})
	d.Waiting = in.Steps[in.Step] != nil && in.Steps[in.Step].Status == saga.StepWaiting
	d.EventID = uuid.NewString()
	d.Picture = buildPicture(c.sagas, in, names, hist, time.Now())
	d.Stalled = c.stalledCommand(r, in, hist)
	d.Actions = slices.DeleteFunc(allowedActions(in), func(a string) bool {
		return !c.can(r, "act", Resource{Kind: "saga", Type: in.Type, ID: in.ID, Op: a})
	})
	if in.Status == saga.StatusCompensated {
		d.Outcome = in.LastError
		for _, h := range hist {
			if h.Event == "compensate" && h.Reason != "" {
				d.Outcome = h.Reason // the last one: what the saga compensated for
			}
		}
	}
	c.render(w, r, http.StatusOK, "saga", "Saga "+id, "sagas", d)
}

// allowedActions are the operator actions the saga's status and phase
// allow, as the orchestrator checks them: none once it ended; Resume
// alone while paused; Abort (cancel) alone while scheduled; Retry, Skip and
// Abort going forward; Retry and Mark compensated while compensating;
// Pause while running or compensating. (A check that needs the
// definition, such as Abort after the pivot, is made when the action is
// confirmed.)
func allowedActions(in *saga.Instance) []string {
	var out []string
	switch {
	case in.Status == saga.StatusCompleted || in.Status == saga.StatusCompensated:
		return nil
	case in.Status == saga.StatusPaused:
		return []string{"resume"}
	case in.Status == saga.StatusScheduled:
		return []string{"abort"}
	case in.Phase == saga.PhaseCompensating:
		out = []string{"retry", "mark-compensated"}
	default:
		out = []string{"retry", "skip", "abort"}
	}
	if in.Status == saga.StatusRunning || in.Status == saga.StatusCompensating {
		out = append(out, "pause")
	}
	return out
}

// actionLabel is an action's name as the console's buttons say it.
func actionLabel(action string) string {
	return map[string]string{"retry": "Retry", "skip": "Skip", "mark-compensated": "Mark compensated", "abort": "Abort",
		"pause": "Pause", "resume": "Resume", "signal": "Send event"}[action]
}

// refusal words why the saga's state refuses action, in the console's
// terms (its buttons and states), not the library's.
func refusal(action string, in *saga.Instance, err error) string {
	if strings.Contains(err.Error(), ": stale: ") && in != nil {
		return fmt.Sprintf("the saga changed since you looked at it: it is now %s at step %q (revision %d). Nothing you did not see is acted on: open its page again and decide on what it shows.",
			in.Status, in.Step, in.Revision)
	}
	if in != nil {
		switch {
		case in.Status == saga.StatusCompleted || in.Status == saga.StatusCompensated:
			return fmt.Sprintf("the saga has ended (%s): there is nothing left to %s.", in.Status, strings.ToLower(actionLabel(action)))
		case action == "skip" && in.Phase == saga.PhaseCompensating:
			return "Skip moves a saga forward past its current step, and this saga is compensating. Use Mark compensated if the step's effect was undone by hand, or Retry to send its compensation again."
		case action == "mark-compensated" && in.Phase != saga.PhaseCompensating:
			return "Mark compensated is for a saga that is compensating, and this one is going forward. Use Skip if the step was done by hand, or Abort to compensate."
		case action == "abort" && in.Phase == saga.PhaseCompensating:
			return "the saga is compensating already. Use Retry to send the current step's compensation again, or Mark compensated if it was undone by hand."
		case action == "resume" && in.Status != saga.StatusPaused:
			return fmt.Sprintf("the saga is not paused (it is %s): there is nothing to resume.", in.Status)
		case action == "pause" && in.Status != saga.StatusRunning && in.Status != saga.StatusCompensating:
			return fmt.Sprintf("only a running or compensating saga can be paused, and this one is %s.", in.Status)
		case in.Status == saga.StatusPaused:
			return "the saga is paused. Resume it first."
		case in.Status == saga.StatusScheduled:
			return "the saga is scheduled and has not started. Abort cancels it."
		}
	}
	// A refusal that needs the definition (the pivot, a parallel group):
	// the library's reason, with its method names in the console's words.
	why := err.Error()
	if i := strings.LastIndex(why, saga.ErrActionNotAllowed.Error()+": "); i >= 0 {
		why = why[i+len(saga.ErrActionNotAllowed.Error())+2:]
	}
	return strings.NewReplacer("MarkCompensated", "Mark compensated",
		"Actor.Operator and Actor.Reason are required", "an operator and a reason are required").Replace(why) + "."
}

func indent(raw []byte) string {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(raw)
	}
	return string(out)
}

type sagaConfirmData struct {
	ID, Action, Question, Effect, Post, Cancel string
	Danger                                     bool
	// Request: the console has no definitions; the action is recorded as
	// an operator request for the service's orchestrator.
	Request bool
	// Saga is the saga as the operator is shown it now: its step and
	// revision go with the form, and the action is refused as stale if
	// the saga moved on before it is confirmed.
	Saga *saga.Instance
	// Moved is set when the saga changed since the page the operator came
	// from (its revision, rev in the link): the page offers no form.
	Moved bool
}

// sagaTarget reads and checks the action and saga id of a confirm page or
// an action; it writes the error page and returns false when they are bad.
func (c *Console) sagaTarget(w http.ResponseWriter, r *http.Request) (sagaConfirmData, bool) {
	d := sagaConfirmData{Action: r.PathValue("action"), ID: r.FormValue("id")}
	if _, ok := sagaEffects[d.Action]; !ok {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("Unknown action %q: nothing was changed.", d.Action))
		return d, false
	}
	if d.ID == "" {
		c.fail(w, r, http.StatusBadRequest, "No saga id given: nothing was changed.")
		return d, false
	}
	return d, true
}

// sagaFor loads the saga an action is on and checks that r's identity may
// take it; it writes the error page and returns nil when not.
func (c *Console) sagaFor(w http.ResponseWriter, r *http.Request, ctx context.Context, d sagaConfirmData) *saga.Instance {
	in, err := c.sagas.Get(ctx, d.ID)
	if errors.Is(err, saga.ErrNotFound) {
		if c.allow(w, r, "act", Resource{Kind: "saga", ID: d.ID, Op: d.Action}) {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No saga %q: nothing was changed.", d.ID))
		}
		return nil
	}
	if err != nil {
		c.dbFail(w, r, err)
		return nil
	}
	if !c.allow(w, r, "act", Resource{Kind: "saga", Type: in.Type, ID: in.ID, Op: d.Action}) {
		return nil
	}
	return in
}

// sagaConfirm is an action's confirm page: what will happen to the saga
// as it is now, and the form that does it, carrying the saga's revision.
func (c *Console) sagaConfirm(w http.ResponseWriter, r *http.Request) {
	if c.cfg.ReadOnly {
		c.fail(w, r, http.StatusForbidden, "The console is read-only.")
		return
	}
	d, ok := c.sagaTarget(w, r)
	if !ok {
		return
	}
	if d.Action == "signal" { // its form is on the saga's page
		http.Redirect(w, r, c.cfg.Prefix+"/saga?id="+url.QueryEscape(d.ID)+"#signal-form", http.StatusSeeOther)
		return
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	if d.Saga = c.sagaFor(w, r, ctx, d); d.Saga == nil {
		return
	}
	if rev := r.URL.Query().Get("rev"); rev != "" && rev != strconv.FormatInt(d.Saga.Revision, 10) {
		d.Moved = true
	}
	d.Effect = sagaEffects[d.Action]
	d.Question = fmt.Sprintf("%s saga %s?", strings.ToUpper(d.Action[:1])+strings.ReplaceAll(d.Action[1:], "-", " "), d.ID)
	d.Post = c.cfg.Prefix + "/saga/" + d.Action
	d.Cancel = c.cfg.Prefix + "/saga?id=" + url.QueryEscape(d.ID)
	d.Danger = d.Action == "abort"
	d.Request = c.requests != nil && d.Action != "withdraw"
	if d.Action == "withdraw" {
		d.Question = fmt.Sprintf("Withdraw the pending operator request on saga %s?", d.ID)
	}
	c.render(w, r, http.StatusOK, "saga_confirm", "Confirm: "+d.Action, "sagas", d)
}

func (c *Console) sagaAct(w http.ResponseWriter, r *http.Request) (string, bool) {
	d, ok := c.sagaTarget(w, r)
	if !ok {
		return "", false
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	if c.sagaFor(w, r, ctx, d) == nil {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	rev, err := strconv.ParseInt(r.PostFormValue("revision"), 10, 64)
	if err != nil || rev <= 0 {
		c.fail(w, r, http.StatusBadRequest, "The form does not say which state of the saga you saw (its revision): nothing was changed. Open the saga's page again.")
		return "", false
	}
	act := map[string]func(*saga.Orchestrator, context.Context, string, saga.Actor) (*saga.Instance, error){
		"retry":            (*saga.Orchestrator).Retry,
		"skip":             (*saga.Orchestrator).Skip,
		"mark-compensated": (*saga.Orchestrator).MarkCompensated,
		"abort":            (*saga.Orchestrator).Abort,
		"pause":            (*saga.Orchestrator).Pause,
		"resume":           (*saga.Orchestrator).Resume,
	}[d.Action]
	by := actor(r, reason)
	by.Revision = rev
	if d.Action == "signal" {
		return c.sagaSignal(w, r, ctx, d, by)
	}
	var in *saga.Instance
	var withdrawn *saga.Request
	switch {
	case d.Action == "withdraw":
		withdrawn, err = c.operator.Withdraw(ctx, d.ID, by)
	case c.requests != nil:
		in, err = c.requests.Request(ctx, d.ID, saga.Action(d.Action), by)
	default:
		in, err = act(c.sagas, ctx, d.ID, by)
	}
	attrs := []any{"operator", by.Operator, "action", d.Action, "saga_id", d.ID, "reason", reason, "revision", rev}
	if err != nil {
		c.sagaRefused(w, r, ctx, d, err, attrs)
		return "", false
	}
	if withdrawn != nil {
		c.log.Info("console: saga request withdrawn", append(attrs, "request", string(withdrawn.Action), "requested_by", withdrawn.Operator)...)
		return "/saga?id=" + url.QueryEscape(d.ID) + "&done=withdraw", true
	}
	if c.requests != nil {
		c.log.Info("console: saga "+d.Action+" requested", append(attrs, "status", string(in.Status))...)
		return "/saga?id=" + url.QueryEscape(d.ID) + "&requested=" + d.Action, true
	}
	c.log.Info("console: saga "+d.Action, append(attrs, "status", string(in.Status))...)
	return "/saga?id=" + url.QueryEscape(d.ID) + "&done=" + d.Action, true
}

// sagaRefused shows why a saga action failed or was refused; nothing was
// changed.
func (c *Console) sagaRefused(w http.ResponseWriter, r *http.Request, ctx context.Context, d sagaConfirmData, err error, attrs []any) {
	switch {
	case errors.Is(err, saga.ErrRequestPending), errors.Is(err, saga.ErrNoRequest):
		c.log.Warn("console: saga action refused", append(attrs, "err", err)...)
		c.fail(w, r, http.StatusConflict, "Refused, nothing was changed: "+err.Error()+".")
	case errors.Is(err, saga.ErrNotFound):
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No saga %q: nothing was changed.", d.ID))
	case errors.Is(err, saga.ErrSagaEnded), errors.Is(err, saga.ErrEventNotAwaited), errors.Is(err, saga.ErrKeyNotHeld):
		c.log.Warn("console: saga event refused", append(attrs, "err", err)...)
		c.fail(w, r, http.StatusConflict, "Refused (recorded in the saga's history and the audit trail): "+err.Error()+".")
	case errors.Is(err, saga.ErrInvalidEvent):
		c.fail(w, r, http.StatusBadRequest, "Nothing was sent: "+err.Error()+".")
	case errors.Is(err, saga.ErrNotRegistered):
		c.log.Warn("console: saga action refused", append(attrs, "err", err)...)
		msg := "this console does not have the saga's definition, so it cannot run the saga's next step. Serve the console from the service that registers the saga's type and version."
		if cur, gerr := c.sagas.Get(ctx, d.ID); gerr == nil {
			msg = fmt.Sprintf("this console does not have the definition of %s v%d, so it cannot run the saga's next step. Serve the console from the service that registers it.", cur.Type, cur.Version)
		}
		c.fail(w, r, http.StatusConflict, "Refused, nothing was changed: "+msg)
	case errors.Is(err, saga.ErrActionNotAllowed):
		c.log.Warn("console: saga action refused", append(attrs, "err", err)...)
		cur, _ := c.sagas.Get(ctx, d.ID)
		c.fail(w, r, http.StatusConflict, "Refused, nothing was changed: "+refusal(d.Action, cur, err))
	default:
		c.log.Error("console: saga action failed", append(attrs, "err", err)...)
		c.fail(w, r, http.StatusInternalServerError, "Failed, nothing was changed: "+err.Error())
	}
}

// sagaFlash is the message after a saga action's redirect, from fixed
// wording only.
func sagaFlash(q url.Values) string {
	if _, ok := sagaEffects[q.Get("requested")]; ok && q.Get("id") != "" {
		return fmt.Sprintf("Requested: %s. The service's running orchestrator applies it on its next timer pass; reload to see it.",
			strings.ReplaceAll(q.Get("requested"), "-", " "))
	}
	if _, ok := sagaEffects[q.Get("done")]; !ok || q.Get("id") == "" {
		return ""
	}
	if q.Get("done") == "signal" {
		return "Done: the event was sent. Without the saga's definition here, the service's running orchestrator applies it on its next pass; the saga's state below is as it is now."
	}
	if q.Get("done") == "withdraw" {
		return "Done: the pending operator request was withdrawn. The saga's state below is as it is now."
	}
	return fmt.Sprintf("Done: %s. The saga's state below is as it is now.", strings.ReplaceAll(q.Get("done"), "-", " "))
}

// sagaSignal sends the event of the saga page's form to the saga
// (saga.Orchestrator.Signal: applied at once with the saga's definition,
// else stored for the service's orchestrator), as by, who saw the saga at
// by.Revision, and goes back to the saga's page.
func (c *Console) sagaSignal(w http.ResponseWriter, r *http.Request, ctx context.Context, d sagaConfirmData, by saga.Actor) (string, bool) {
	t := saga.EventTarget{SagaID: d.ID, Event: strings.TrimSpace(r.PostFormValue("event")), EventID: strings.TrimSpace(r.PostFormValue("event_id"))}
	payload := json.RawMessage(strings.TrimSpace(r.PostFormValue("payload")))
	if t.Event == "" {
		c.fail(w, r, http.StatusBadRequest, "Name the event to send: nothing was sent.")
		return "", false
	}
	if len(payload) > 0 && !json.Valid(payload) {
		c.fail(w, r, http.StatusBadRequest, "The payload is not JSON: nothing was sent.")
		return "", false
	}
	if t.EventID == "" {
		t.EventID = uuid.NewString()
	}
	attrs := []any{"operator", by.Operator, "action", "signal", "saga_id", d.ID, "event", t.Event, "event_id", t.EventID, "reason", by.Reason, "revision", by.Revision}
	if err := c.sagas.Signal(ctx, t, payload, by); err != nil {
		c.sagaRefused(w, r, ctx, d, err, attrs)
		return "", false
	}
	c.log.Info("console: saga event sent", attrs...)
	return "/saga?id=" + url.QueryEscape(d.ID) + "&done=signal", true
}
