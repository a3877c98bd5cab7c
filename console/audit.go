package console

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"

	"github.com/millrace/millrace/internal/audit"
)

type auditData struct {
	// The filter: who (as the one who acted or the planner they acted
	// for), what (an action, such as saga.retry, or a family: saga), on
	// which resource (a saga id, an event id, a bulk operation id).
	Operator, Action, Target string
	// Operation keeps one bulk operation's entries.
	Operation string
	List      []audit.Record
	// Next is the id to continue from (the next page), 0 after the last.
	Next int64
}

// NextQuery is the query string of the next page, filter kept.
func (d auditData) NextQuery() template.URL {
	v := url.Values{}
	for k, s := range map[string]string{"operator": d.Operator, "action": d.Action, "target": d.Target, "operation": d.Operation} {
		if s != "" {
			v.Set(k, s)
		}
	}
	v.Set("before", strconv.FormatInt(d.Next, 10))
	return template.URL(v.Encode()) // encoded: only its own escapes
}

// auditPage lists the audit trail of this service's schema, newest first,
// a page at a time: every operator action from the console, the millrace
// command and the Go API, with who, on whose plan, why, from where, what,
// on which resource, and the state before and after.
func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	if !c.allow(w, r, "read", Resource{Kind: "audit"}) {
		return
	}
	q := r.URL.Query()
	d := auditData{Operator: q.Get("operator"), Action: q.Get("action"), Target: q.Get("target"), Operation: q.Get("operation")}
	f := audit.Filter{Operator: d.Operator, Action: d.Action, Target: d.Target, Operation: d.Operation, Limit: c.cfg.PageSize + 1}
	if s := q.Get("before"); s != "" {
		before, err := strconv.ParseInt(s, 10, 64)
		if err != nil || before <= 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Bad page: before=%q is not an entry id.", s))
			return
		}
		f.Before = before
	}
	ctx, cancel := reqCtx(r)
	defer cancel()
	list, err := c.trail.List(ctx, c.pool, f)
	if err != nil {
		c.dbFail(w, r, err)
		return
	}
	if len(list) > c.cfg.PageSize {
		list = list[:c.cfg.PageSize]
		d.Next = list[len(list)-1].ID
	}
	d.List = list
	c.render(w, r, http.StatusOK, "audit", "Audit trail", "audit", d)
}
