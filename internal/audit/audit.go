// Package audit is millrace's one audit trail of operator actions: the
// table audit_log (migration 013), written in the transaction of the
// action it records by every package that acts for an operator (saga,
// outbox, inbox, the console and the millrace command), read by the
// console's audit page and millrace audit list, counted in metrics and
// kept by retention.
//
// An entry says who acted (core.Actor.Operator), on whose plan
// (OnBehalfOf), why, from where, what (the action and its outcome), on
// which resource, as part of which bulk operation, and the state before
// and after. It never holds a payload.
package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
)

// Outcomes of an action.
const (
	// Done: the action took effect in its transaction.
	Done = "done"
	// Requested: an operator request was filed for the service's running
	// orchestrator (saga.Orchestrator.Request, a bulk operation's Apply).
	Requested = "requested"
	// Applied: the orchestrator applied a request, as its requester.
	Applied = "applied"
	// Refused: the saga's state refused a request when it was filed (a
	// bulk operation) or when the orchestrator came to apply it.
	Refused = "refused"
)

// Kinds of resource.
const (
	KindSaga     = "saga"      // Target: the saga id; Scope: its type
	KindSagaBulk = "saga_bulk" // Target: the bulk operation id
	KindOutbox   = "outbox"    // Target: the event id; Scope: its topic
	KindInbox    = "inbox"     // Target: the event id; Scope: the consumer
	KindPoison   = "poison"    // Scope: the poison topic
)

// Entry is one operator action to record.
type Entry struct {
	Actor core.Actor
	// Action is what was done: saga.retry, saga.bulk.plan,
	// outbox.requeue, inbox.discard, poison.requeue, ...
	Action string
	// Outcome is Done, Requested, Applied or Refused. Defaults to Done.
	Outcome string
	Kind    string
	Scope   string
	Target  string
	// Before and After are the resource's state before and after the
	// action, and Detail anything else worth keeping (a filter, counts,
	// a refusal's reason), each encoded as JSON (a []byte or
	// json.RawMessage is JSON already); nil for none.
	Before, After, Detail any
}

// Check returns an error wrapping core.ErrNoActor when by lacks an
// operator or a reason: what names the action refused.
func Check(by core.Actor, what string) error {
	if strings.TrimSpace(by.Operator) == "" || strings.TrimSpace(by.Reason) == "" {
		return fmt.Errorf("%s: %w", what, core.ErrNoActor)
	}
	return nil
}

// Execer is what Write needs of a transaction (or a pool, for an action
// outside the database, such as a poison topic's requeue).
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Trail writes and reads one schema's audit_log. It is safe for
// concurrent use.
type Trail struct {
	insert, list string
}

// New returns the Trail of schema, which must be a valid schema name.
func New(schema string) *Trail {
	t := sqlident.Table(schema, "audit_log")
	return &Trail{
		insert: fmt.Sprintf(`INSERT INTO %s (operator, on_behalf_of, reason, source, action, outcome, kind, scope, target, operation, before, after, detail)
SELECT o, b, r, s, a, c, k, sc, t, op, be::jsonb, af::jsonb, d::jsonb
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
              $11::text[], $12::text[], $13::text[]) AS x(o, b, r, s, a, c, k, sc, t, op, be, af, d)`, t),
		list: fmt.Sprintf(`SELECT id, at, operator, on_behalf_of, reason, source, action, outcome, kind, scope, target, operation, before, after, detail
  FROM %s
 WHERE ($1 = 0 OR id < $1)
   AND ($2 = '' OR target = $2)
   AND ($3 = '' OR operation = $3)
   AND ($4 = '' OR operator = $4 OR on_behalf_of = $4)
   AND ($5 = '' OR action = $5 OR left(action, length($5) + 1) = $5 || '.')
   AND ($6::timestamptz IS NULL OR at >= $6)
 ORDER BY id DESC
 LIMIT $7`, t),
	}
}

// Write records entries in db (the action's transaction), in one
// statement. Every entry's Actor must have an operator and a reason.
func (t *Trail) Write(ctx context.Context, db Execer, entries ...Entry) error {
	if len(entries) == 0 {
		return nil
	}
	cols := make([][]*string, 13)
	for i := range cols {
		cols[i] = make([]*string, len(entries))
	}
	for i, e := range entries {
		if err := Check(e.Actor, e.Action); err != nil {
			return err
		}
		from := e.Actor.From
		if strings.TrimSpace(from) == "" {
			from = "go"
		}
		outcome := e.Outcome
		if outcome == "" {
			outcome = Done
		}
		for j, s := range []string{e.Actor.Operator, e.Actor.OnBehalfOf, e.Actor.Reason, from, e.Action, outcome, e.Kind,
			e.Scope, e.Target, e.Actor.Operation} {
			s = Clean(s)
			cols[j][i] = &s
		}
		for j, v := range []any{e.Before, e.After, e.Detail} {
			raw, err := encode(v)
			if err != nil {
				return fmt.Errorf("audit: %s: %w", e.Action, err)
			}
			cols[10+j][i] = raw
		}
	}
	args := make([]any, len(cols))
	for i, c := range cols {
		args[i] = c
	}
	if _, err := db.Exec(ctx, t.insert, args...); err != nil {
		return fmt.Errorf("audit: record %s: %w", entries[0].Action, err)
	}
	return nil
}

// encode returns v as JSON that jsonb stores (no \u0000), or nil for nil.
func encode(v any) (*string, error) {
	if v == nil {
		return nil, nil
	}
	var raw []byte
	switch x := v.(type) {
	case json.RawMessage:
		if len(x) == 0 {
			return nil, nil
		}
		raw = x
	case []byte: // JSON already
		if len(x) == 0 {
			return nil, nil
		}
		raw = x
	default:
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return nil, err
		}
	}
	s := strings.ReplaceAll(string(raw), `\u0000`, `\ufffd`)
	return &s, nil
}

// Clean makes s storable in a text column and readable in a listing:
// valid UTF-8, no NUL, no line breaks, at most about 2000 bytes.
func Clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.NewReplacer("\x00", "\uFFFD", "\r\n", " ", "\n", " ", "\r", " ").Replace(s)
	if len(s) > 2000 {
		s = strings.ToValidUTF8(s[:2000], "")
	}
	return s
}

// Record is one entry as stored.
type Record struct {
	ID         int64           `json:"id"`
	At         time.Time       `json:"at"`
	Operator   string          `json:"operator"`
	OnBehalfOf string          `json:"on_behalf_of,omitempty"`
	Reason     string          `json:"reason"`
	Source     string          `json:"source"`
	Action     string          `json:"action"`
	Outcome    string          `json:"outcome"`
	Kind       string          `json:"kind"`
	Scope      string          `json:"scope,omitempty"`
	Target     string          `json:"target,omitempty"`
	Operation  string          `json:"operation,omitempty"`
	Before     json.RawMessage `json:"before,omitempty"`
	After      json.RawMessage `json:"after,omitempty"`
	Detail     json.RawMessage `json:"detail,omitempty"`
}

// Filter selects entries for List; the zero value lists the newest 100.
type Filter struct {
	// Target keeps one resource's entries (a saga id, an event id).
	Target string
	// Operation keeps one bulk operation's entries.
	Operation string
	// Operator keeps the entries of one operator, as the one who acted or
	// as the planner they acted for.
	Operator string
	// Action keeps one action (saga.retry) or a family (saga).
	Action string
	// Since keeps entries at or after it.
	Since time.Time
	// Before continues a listing: the entries with an id below it (the
	// last ID of the previous page).
	Before int64
	// Limit is the page size. Defaults to 100; at most 1000.
	Limit int
}

// Querier is what List needs of a pool or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// List returns the entries f selects, newest first: a walk back along the
// primary key (a Target or Operation uses its own index).
func (t *Trail) List(ctx context.Context, db Querier, f Filter) ([]Record, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	f.Limit = min(f.Limit, 1000)
	var since *time.Time
	if !f.Since.IsZero() {
		since = &f.Since
	}
	rows, err := db.Query(ctx, t.list, f.Before, f.Target, f.Operation, f.Operator, f.Action, since, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("audit: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		err := row.Scan(&r.ID, &r.At, &r.Operator, &r.OnBehalfOf, &r.Reason, &r.Source, &r.Action, &r.Outcome, &r.Kind,
			&r.Scope, &r.Target, &r.Operation, &r.Before, &r.After, &r.Detail)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("audit: list: %w", err)
	}
	return out, nil
}

// Probe writes no entry through the statement Write uses: it fails only
// when audit_log is missing (migration 013 not applied) or a privilege on
// it is. Long-running parts run it at start, in a probe transaction.
func (t *Trail) Probe(ctx context.Context, db Execer) error {
	args := make([]any, 13)
	for i := range args {
		args[i] = []string{}
	}
	_, err := db.Exec(ctx, t.insert, args...)
	return err
}
