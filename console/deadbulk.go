package console

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/poisontopic"
	"github.com/millrace/millrace/kafka"
)

// deadFilter is a dead-letter page's filter as typed (outbox, an inbox, a
// poison topic): what "requeue or discard all N matching" acts on.
type deadFilter struct {
	Kind     string // outbox, inbox, poison
	Consumer string // inbox: whose dead letters
	// Topic is the dead letters' topic; on a poison topic, the poison
	// topic itself.
	Topic string
	Key   string // outbox, inbox: the partition key
	// Error is an SQL LIKE pattern on the last error; on a poison topic,
	// on the reason.
	Error string
	From  string // poison: the topic the messages were poisoned from
	// Older is an age (30m, 2h): dead (poisoned) longer ago than it.
	Older  string
	before time.Time
}

// field is a hidden form field.
type field struct{ Name, Value string }

// readFilter reads a filter of kind from form values; it writes the error
// page and returns false when one is bad.
func (c *Console) readFilter(w http.ResponseWriter, r *http.Request, kind string, get func(string) string) (deadFilter, bool) {
	f := deadFilter{Kind: kind, Consumer: get("consumer"), Topic: strings.TrimSpace(get("topic")), Key: get("key"),
		Error: get("error"), From: strings.TrimSpace(get("from")), Older: strings.TrimSpace(get("older"))}
	if kind != "poison" {
		f.From = ""
	} else {
		f.Key = ""
	}
	if f.Older != "" {
		age, err := time.ParseDuration(f.Older)
		if err != nil || age < 0 {
			c.fail(w, r, http.StatusBadRequest, fmt.Sprintf("Bad age %q: write it like 30m, 2h or 48h.", f.Older))
			return f, false
		}
		f.before = time.Now().Add(-age)
	}
	return f, true
}

// selected reports whether f selects anything in particular: a bulk
// action needs it (beyond the consumer, or the poison topic).
func (f deadFilter) selected() bool {
	if f.Kind == "poison" {
		return f.Error != "" || f.From != "" || f.Older != ""
	}
	return f.Topic != "" || f.Key != "" || f.Error != "" || f.Older != ""
}

// Fields are f's non-empty fields, for a form's hidden inputs.
func (f deadFilter) Fields() []field {
	var out []field
	for _, kv := range [][2]string{{"consumer", f.Consumer}, {"topic", f.Topic}, {"key", f.Key}, {"error", f.Error}, {"from", f.From}, {"older", f.Older}} {
		if kv[1] != "" {
			out = append(out, field{kv[0], kv[1]})
		}
	}
	return out
}

// Query is f as a query string, for links.
func (f deadFilter) Query() template.URL {
	v := url.Values{}
	for _, kv := range f.Fields() {
		v.Set(kv.Name, kv.Value)
	}
	return template.URL(v.Encode()) // encoded: only its own escapes
}

// Describe says what f selects, in words.
func (f deadFilter) Describe() string {
	var parts []string
	add := func(format, v string) {
		if v != "" {
			parts = append(parts, fmt.Sprintf(format, v))
		}
	}
	if f.Kind != "poison" {
		add("topic %s", f.Topic)
	}
	add("partition key %s", f.Key)
	add("poisoned from %s", f.From)
	if f.Kind == "poison" {
		add("reason like %s", f.Error)
	} else {
		add("last error like %s", f.Error)
	}
	add("older than %s", f.Older)
	return strings.Join(parts, ", ")
}

// resource is what f selects, for Config.Authorize.
func (f deadFilter) resource() Resource {
	res := Resource{Kind: f.Kind, Type: f.Consumer}
	if f.Kind == "poison" {
		res.Type = f.Topic
	}
	return res
}

func (f deadFilter) deadQuery() core.DeadLetterQuery {
	return core.DeadLetterQuery{Topic: f.Topic, PartitionKey: f.Key, Error: f.Error, DeadBefore: f.before}
}

func (f deadFilter) poisonQuery() poisontopic.Query {
	return poisontopic.Query{Reason: f.Error, FromTopic: f.From, PoisonedBefore: f.before}
}

// listPath is the path of f's list page, filter kept, ending so that more
// query parameters can follow.
func (f deadFilter) listPath() string {
	path := map[string]string{"outbox": "/outbox/dead", "inbox": "/inbox/dead", "poison": "/poison"}[f.Kind]
	if q := f.Query(); q != "" {
		return path + "?" + string(q) + "&"
	}
	return path + "?"
}

// bulkRow is one dead letter on a bulk confirm page.
type bulkRow struct {
	ID, Topic, Text string
	At              time.Time
}

var bulkWhat = map[string]string{"outbox": "outbox dead letters", "inbox": "inbox dead letters", "poison": "poisoned messages"}

var bulkEffects = map[string]string{
	"outbox/requeue": "The relay publishes each again, starting from its first attempt; their last errors stay on record.",
	"outbox/discard": "None of them is ever published; later events of their partition keys flow again. This cannot be undone.",
	"inbox/requeue":  "The processor runs the handler on each again, with its attempts back at zero.",
	"inbox/discard":  "Each is marked processed without running the handler, and no longer holds its key. This cannot be undone.",
	"poison/requeue": "Each is published back to the topic it was poisoned from, payload and metadata as they were; Kafka keeps it on the poison topic too, so requeue it once, after fixing the consumer. A message that does not say its original topic is refused and counted. (There is no discard: Kafka cannot delete one message from a topic; the poison topic's retention removes them in time.)",
}

// bulkTarget reads a bulk action's kind, action and filter; it writes the
// error page and returns false when they are bad or select nothing in
// particular.
func (c *Console) bulkTarget(w http.ResponseWriter, r *http.Request, kind, action string, get func(string) string) (deadFilter, bool) {
	if _, ok := bulkEffects[kind+"/"+action]; !ok {
		c.fail(w, r, http.StatusNotFound, fmt.Sprintf("Unknown action %q: nothing was changed.", action))
		return deadFilter{}, false
	}
	f, ok := c.readFilter(w, r, kind, get)
	if !ok {
		return f, false
	}
	switch {
	case kind == "inbox" && f.Consumer == "":
		c.fail(w, r, http.StatusBadRequest, "No consumer given: nothing was changed.")
		return f, false
	case kind == "poison" && len(c.cfg.KafkaBrokers) == 0:
		c.fail(w, r, http.StatusBadRequest, "The console has no Kafka brokers configured: nothing was requeued.")
		return f, false
	case kind == "poison":
		if err := kafka.ValidateTopic(f.Topic); err != nil {
			c.fail(w, r, http.StatusBadRequest, "Not a Kafka topic name: "+err.Error())
			return f, false
		}
	}
	if !f.selected() {
		c.fail(w, r, http.StatusBadRequest, "Filter first (a bulk action applies to what the filter selects): nothing was changed.")
		return f, false
	}
	return f, true
}

// bulkDryRun counts what f selects and returns the first page of it.
func (c *Console) bulkDryRun(ctx context.Context, f deadFilter, page int) (int, []bulkRow, error) {
	var rows []bulkRow
	switch f.Kind {
	case "outbox":
		d, err := c.outbox.DryRun(ctx, f.deadQuery(), page)
		if err != nil {
			return 0, nil, err
		}
		for _, e := range d.First {
			rows = append(rows, bulkRow{e.EventID, e.Topic, e.LastError, e.DeadAt})
		}
		return d.Count, rows, nil
	case "inbox":
		dl, err := inbox.NewDeadLetters(c.pool, inbox.DeadLetterConfig{Schema: c.schema, Consumer: f.Consumer})
		if err != nil {
			return 0, nil, err
		}
		d, err := dl.DryRun(ctx, f.deadQuery(), page)
		if err != nil {
			return 0, nil, err
		}
		for _, e := range d.First {
			rows = append(rows, bulkRow{e.EventID, e.Topic, e.LastError, e.DeadAt})
		}
		return d.Count, rows, nil
	default:
		d, err := poisontopic.DryRunMatching(ctx, c.cfg.KafkaBrokers, f.Topic, f.poisonQuery(), page)
		if err != nil {
			return 0, nil, err
		}
		for _, m := range d.First {
			rows = append(rows, bulkRow{m.UUID, m.Topic, m.Reason, m.Time})
		}
		return d.Count, rows, nil
	}
}

// bulkAct applies action to what f selects, by by, and returns how many
// it acted on and how many it refused (a poisoned message that does not
// say its original topic). Each dead letter acted on is in the audit
// trail (outbox, inbox: in the transaction that acted on it); a poison
// topic's requeue is recorded once, after it.
func (c *Console) bulkAct(ctx context.Context, f deadFilter, action string, by core.Actor) (n, refused int, err error) {
	switch f.Kind {
	case "outbox":
		act := c.outbox.RequeueMatching
		if action == "discard" {
			act = c.outbox.DiscardMatching
		}
		n, err = act(ctx, f.deadQuery(), by)
		return n, 0, err
	case "inbox":
		dl, err := inbox.NewDeadLetters(c.pool, inbox.DeadLetterConfig{Schema: c.schema, Consumer: f.Consumer})
		if err != nil {
			return 0, 0, err
		}
		act := dl.RequeueMatching
		if action == "discard" {
			act = dl.DiscardMatching
		}
		n, err = act(ctx, f.deadQuery(), by)
		return n, 0, err
	default:
		out, err := poisontopic.RequeueMatching(ctx, c.cfg.KafkaBrokers, f.Topic, f.poisonQuery())
		detail := map[string]any{"filter": f.Describe(), "matched": out.Matched, "requeued": out.Requeued, "refused": out.Refused}
		if aerr := c.auditPoison(ctx, by, f.Topic, detail, out.Requeued, err); aerr != nil {
			err = errors.Join(err, aerr)
		}
		return out.Requeued, out.Refused[poisontopic.RefusedNoTopic], err
	}
}

// auditPoison records a poison topic's requeue in the audit trail, after
// it (Kafka is not in the transaction): what it selected and how many it
// sent, also when it failed after sending some.
func (c *Console) auditPoison(ctx context.Context, by core.Actor, topic string, detail map[string]any, sent int, err error) error {
	if err != nil && sent == 0 {
		return nil // nothing sent: nothing to record
	}
	if err != nil {
		detail["error"] = err.Error()
	}
	e := audit.Entry{Actor: by, Action: "poison.requeue", Kind: audit.KindPoison, Scope: topic, Detail: detail}
	if err := c.trail.Write(ctx, c.pool, e); err != nil {
		return fmt.Errorf("requeued %d, but the audit trail did not record it: %w", sent, err)
	}
	audit.Count(e)
	return nil
}

type bulkConfirmData struct {
	Filter deadFilter
	Action string
	Label  string // Requeue, Discard
	What   string // outbox dead letters, ...
	Effect string
	Count  int
	Rows   []bulkRow
	Post   string
	Cancel string
}

// bulkConfirm is the confirm page of a bulk dead-letter action: the count
// of what the filter selects now, the first of them, and the form that
// acts. It changes nothing.
func (c *Console) bulkConfirm(kind string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.ReadOnly {
			c.fail(w, r, http.StatusForbidden, "The console is read-only.")
			return
		}
		action := r.PathValue("action")
		if kind == "poison" {
			action = "requeue"
		}
		f, ok := c.bulkTarget(w, r, kind, action, r.URL.Query().Get)
		if !ok || !c.allow(w, r, Action(action), f.resource()) {
			return
		}
		ctx, cancel := reqCtx(r)
		defer cancel()
		n, rows, err := c.bulkDryRun(ctx, f, 20)
		if err != nil {
			c.dbFail(w, r, err)
			return
		}
		d := bulkConfirmData{Filter: f, Action: action, Label: strings.ToUpper(action[:1]) + action[1:], What: bulkWhat[kind],
			Effect: bulkEffects[kind+"/"+action], Count: n, Rows: rows, Cancel: c.cfg.Prefix + strings.TrimSuffix(f.listPath(), "&")}
		d.Cancel = strings.TrimSuffix(d.Cancel, "?")
		if kind == "poison" {
			d.Post = c.cfg.Prefix + "/poison/bulk"
		} else {
			d.Post = c.cfg.Prefix + "/" + kind + "/dead/bulk/" + action
		}
		c.render(w, r, http.StatusOK, "dead_bulk", "Confirm: "+action+" in bulk", kind, d)
	}
}

// bulkPost applies a bulk dead-letter action to what the filter selects
// when it is posted, logs it with the operator, the reason, the filter
// and the counts, and goes back to the list.
func (c *Console) bulkPost(kind string) func(w http.ResponseWriter, r *http.Request) (string, bool) {
	return func(w http.ResponseWriter, r *http.Request) (string, bool) {
		action := r.PathValue("action")
		if kind == "poison" {
			action = "requeue"
		}
		f, ok := c.bulkTarget(w, r, kind, action, r.PostForm.Get)
		if !ok || !c.allow(w, r, Action(action), f.resource()) {
			return "", false
		}
		reason, ok := c.reason(w, r)
		if !ok {
			return "", false
		}
		by := actor(r, reason)
		// The action goes on if the browser goes away.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Minute)
		defer cancel()
		n, refused, err := c.bulkAct(ctx, f, action, by)
		attrs := []any{"operator", by.Operator, "reason", reason, "action", action,
			"kind", kind, "filter", f.Describe(), "count", n}
		if f.Consumer != "" {
			attrs = append(attrs, "consumer", f.Consumer)
		}
		if kind == "poison" {
			attrs = append(attrs, "topic", f.Topic, "refused", refused)
		}
		if err != nil {
			c.log.Error("console: "+bulkWhat[kind]+" "+action+" in bulk failed", append(attrs, "err", err)...)
			c.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("The bulk %s failed after %d: %v", action, n, err))
			return "", false
		}
		c.log.Info("console: "+bulkWhat[kind]+" "+map[string]string{"requeue": "requeued", "discard": "discarded"}[action]+" in bulk", attrs...)
		to := fmt.Sprintf("%skind=%s&done=%s&n=%d", f.listPath(), kind, action, n)
		if refused > 0 {
			to += "&refused=" + strconv.Itoa(refused)
		}
		return to, true
	}
}
