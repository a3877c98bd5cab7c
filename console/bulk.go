package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/millrace/millrace/saga"
)

// sagaQuery reads the sagas list's filter (type, status, step, error,
// older, attr) from form values into a bulk query; it writes the error page
// and returns false when one is bad (an attribute filter is checked by the
// query's use).
func (c *Console) sagaQuery(w http.ResponseWriter, r *http.Request, v url.Values) (saga.Query, bool) {
	get := v.Get
	q := saga.Query{Type: get("type"), Step: get("step"), Error: get("error"), Attrs: attrFilters(v)}
	if s := get("status"); s != "" {
		if !slices.Contains(sagaStatuses, saga.Status(s)) {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Unknown status %q.", s))
			return q, false
		}
		q.Status = saga.Status(s)
	}
	if s := get("older"); s != "" {
		age, err := time.ParseDuration(s)
		if err != nil || age < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Bad age %q: write it like 30m, 2h or 48h.", s))
			return q, false
		}
		q.CreatedBefore = time.Now().Add(-age)
	}
	return q, true
}

// bulkCount is, for the sagas list, how many sagas its filter selects
// (saga.Orchestrator.DryRun), or -1 when the filter selects nothing in
// particular (no type, status, step or error) or the console is
// read-only.
func (c *Console) bulkCount(ctx context.Context, q saga.Query) (int64, error) {
	if c.cfg.ReadOnly || (q.Type == "" && q.Status == "" && q.Step == "" && q.Error == "" && len(q.Attrs) == 0) {
		return -1, nil
	}
	d, err := c.operator.DryRun(ctx, q, 1)
	if err != nil {
		return 0, err
	}
	return int64(d.Count), nil
}

// sagaBulkPlan records a bulk operation on every saga the list's filter
// selects now (saga.Orchestrator.Plan), with the operator and the reason, and
// goes to its confirm page. Nothing is filed yet.
func (c *Console) sagaBulkPlan(w http.ResponseWriter, r *http.Request) (string, bool) {
	action := r.PostFormValue("action")
	if !slices.Contains(sagaActionOrder, action) {
		c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Unknown action %q: nothing was changed.", action))
		return "", false
	}
	q, ok := c.sagaQuery(w, r, r.PostForm)
	if !ok || !c.allow(w, r, "act-bulk", Resource{Kind: "saga", Type: q.Type, Op: action}) {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	by := actor(r, reason)
	operator := by.Operator
	b, err := c.operator.Plan(ctx, saga.Action(action), q, by)
	if errors.Is(err, saga.ErrInvalidQuery) && len(q.Attrs) > 0 {
		c.fail(w, r, http.StatusBadRequest, "Bad filter, nothing was changed: "+err.Error()+".")
		return "", false
	}
	if errors.Is(err, saga.ErrInvalidQuery) {
		c.fail(w, r, http.StatusBadRequest, "Filter by type, status, step, last error or attribute first: nothing was changed.")
		return "", false
	}
	if err != nil {
		c.dbFail(w, r, err)
		return "", false
	}
	c.log.Info("console: saga bulk "+action+" planned", "operator", operator, "operation", b.ID, "selected", b.Counts.Selected, "reason", reason)
	return "/sagas/bulk?id=" + url.QueryEscape(b.ID), true
}

type refusedRow struct {
	Reason string
	N      int64
}

type sagaBulkData struct {
	Op *saga.BulkOperation
	// Confirm: nothing is filed yet; the page asks to confirm.
	Confirm bool
	Label   string
	Effect  string
	Danger  bool
	Sagas   []*saga.Instance
	Refused []refusedRow
	// RefusedTotal is the sum of Refused.
	RefusedTotal int64
	Query        template.URL // the filter, for a link back to the list (encoded)
	// Filing: the confirmation started filing in the background.
	Filing bool
	// CanConfirm: this identity may confirm the operation (file what is
	// left); the one who confirms acts, on the planner's behalf.
	CanConfirm bool
}

// sagaBulkPage shows a bulk operation: before it is applied, the confirm
// page with the count and the first sagas it selected; after, its progress
// and outcome counts (saga.Orchestrator.BulkStatus).
func (c *Console) sagaBulkPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	ctx, cancel := reqCtx(r)
	defer cancel()
	b, ok := c.bulkOperation(w, r, ctx, id, "read")
	if !ok {
		return
	}
	can := c.can(r, "act-bulk", Resource{Kind: "saga", Type: b.Query.Type, ID: b.ID, Op: string(b.Action)})
	d := sagaBulkData{Op: b, Label: actionLabel(string(b.Action)), Effect: sagaEffects[string(b.Action)], Danger: b.Action == saga.ActionAbort,
		Confirm:      b.Filed == nil && b.Counts.Unfiled == b.Counts.Selected && b.Counts.Selected > 0 && can,
		RefusedTotal: b.Counts.RefusedTotal(), Filing: r.URL.Query().Get("filing") == "1" && b.Counts.Unfiled > 0, CanConfirm: can}
	var err error
	if d.Filing {
		d.Confirm = false // confirmed: the filing has begun
	}
	for reason, n := range b.Counts.Refused {
		d.Refused = append(d.Refused, refusedRow{reason, n})
	}
	sort.Slice(d.Refused, func(i, j int) bool { return d.Refused[i].Reason < d.Refused[j].Reason })
	v := url.Values{"attr": b.Query.Attrs}
	for k, s := range map[string]string{"type": b.Query.Type, "status": string(b.Query.Status), "step": b.Query.Step, "error": b.Query.Error} {
		if s != "" {
			v.Set(k, s)
		}
	}
	d.Query = template.URL(v.Encode()) // encoded: only its own escapes
	if d.Confirm {
		if d.Sagas, err = c.operator.BulkSagas(ctx, id, 20); err != nil {
			c.dbFail(w, r, err)
			return
		}
	}
	c.render(w, r, http.StatusOK, "saga_bulk", "Bulk "+string(b.Action), "sagas", d)
}

// bulkOperation reads a bulk operation and checks that r's identity may
// take action ("read", or "act-bulk" to confirm it) on it; it writes the
// error page and reports false when not.
func (c *Console) bulkOperation(w http.ResponseWriter, r *http.Request, ctx context.Context, id string, action Action) (*saga.BulkOperation, bool) {
	b, err := c.operator.BulkStatus(ctx, id)
	if errors.Is(err, saga.ErrBulkNotFound) {
		if c.allow(w, r, action, Resource{Kind: "saga", ID: id}) {
			c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No bulk operation %q: nothing was changed.", id))
		}
		return nil, false
	}
	if err != nil {
		c.dbFail(w, r, err)
		return nil, false
	}
	res := Resource{Kind: "saga", Type: b.Query.Type, ID: b.ID}
	if action != "read" {
		res.Op = string(b.Action)
	}
	return b, c.allow(w, r, action, res)
}

// bulkInRequest is the largest operation the confirmation files before it
// answers; a larger one is filed in the background.
const bulkInRequest = 5000

// sagaBulkApply confirms a bulk operation: it files the operation's
// requests (saga.Orchestrator.Apply) in the name of the one who confirms,
// on behalf of its planner, and goes to its outcome page. The filing goes
// on if the browser goes away; a second press files only what is left.
func (c *Console) sagaBulkApply(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PostFormValue("id")
	st, ok := c.bulkOperation(w, r, r.Context(), id, "act-bulk")
	if !ok {
		return "", false
	}
	reason, ok := c.reason(w, r)
	if !ok {
		return "", false
	}
	by := actor(r, reason)
	operator := by.Operator
	// A large operation is filed in the background (500 requests per
	// transaction): the outcome page shows its progress as it goes. Two
	// filings of one operation never file a saga twice (each takes its
	// sagas with SKIP LOCKED).
	if st.Counts.Unfiled > c.bulkInRequest {
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Hour)
			defer cancel()
			b, err := c.operator.Apply(ctx, id, by)
			if err != nil {
				c.log.Error("console: saga bulk apply failed", "operator", operator, "operation", id, "err", err)
				return
			}
			c.log.Info("console: saga bulk "+string(b.Action)+" filed", "operator", operator, "operation", id,
				"filed", b.Counts.Filed, "refused", b.Counts.RefusedTotal())
		}()
		return "/sagas/bulk?id=" + url.QueryEscape(id) + "&filing=1", true
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Minute)
	defer cancel()
	b, err := c.operator.Apply(ctx, id, by)
	if errors.Is(err, saga.ErrBulkNotFound) {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("No bulk operation %q: nothing was changed.", id))
		return "", false
	}
	if err != nil {
		c.log.Error("console: saga bulk apply failed", "operator", operator, "operation", id, "err", err)
		c.fail(w, r, http.StatusInternalServerError, "Filing the requests failed; those filed stay filed, press again to file the rest: "+err.Error())
		return "", false
	}
	c.log.Info("console: saga bulk "+string(b.Action)+" filed", "operator", operator, "planned_by", b.Operator, "operation", id,
		"filed", b.Counts.Filed, "refused", b.Counts.RefusedTotal())
	return "/sagas/bulk?id=" + url.QueryEscape(id) + "&filed=1", true
}

// attrFilters are the attribute filters of form values v ("attr",
// repeated; the empty ones left out): saga.ListParams.Attrs.
func attrFilters(v url.Values) []string {
	var out []string
	for _, f := range v["attr"] {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
