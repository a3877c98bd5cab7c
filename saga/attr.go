package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/internal/sqlident"
)

// Key is a correlation key of a saga type (Spec.Keys): a business value
// computed from a saga's data (an order number, a payment provider's id)
// by which SignalByKey finds the saga, and by which List and bulk
// queries filter (Attrs, "name=value"). It is written to table saga_attr
// with the saga's state, at the start and whenever the data changes; a
// saga holds its keys until it ends (completed or compensated).
type Key[D any] struct {
	// Name identifies the key. Required, unique among the definition's
	// keys and attributes, at most 200 bytes of UTF-8 without NUL.
	Name string
	// Unique makes the key held by one running saga of the type at a
	// time: StartTx refuses a saga whose value another running saga of
	// the type holds, with ErrKeyTaken, before it writes anything. A
	// value that changes later (a step's OnSuccess, say) to one another
	// running saga holds is not taken: the saga keeps the value it held.
	// Defaults to false: a shared key, which several running sagas may
	// hold, and SignalByKey delivers to each of them.
	Unique bool
	// Value computes the key's value from the data. Required. An empty
	// value holds no key. One that panics refuses the start (ErrPanic);
	// on a later change of the data it leaves the saga's keys and
	// attributes as they were (logged), released when the saga ends. The
	// same goes for Attr's functions.
	Value func(data D) string
}

// Attr is a search attribute of a saga type (Spec.Attributes): a typed
// value computed from a saga's data (a customer, an amount, a due date),
// written to table saga_attr with the saga's state, at the start and
// whenever the data changes, by which List and bulk queries filter
// (ListParams.Attrs, Query.Attrs). Set exactly one of Text, Number and
// Time.
type Attr[D any] struct {
	// Name identifies the attribute. Required, unique among the
	// definition's keys and attributes, at most 200 bytes of UTF-8
	// without NUL.
	Name string
	// Text computes a text attribute; an empty string is no value.
	Text func(data D) string
	// Number computes a number attribute; NaN is no value.
	Number func(data D) float64
	// Time computes a time attribute; the zero time is no value.
	Time func(data D) time.Time
}

// Errors of keyed starts and signals.
var (
	// ErrKeyTaken: StartTx was given data whose unique key (Key.Unique)
	// another running saga of the type holds. The error names the key,
	// the value and the saga holding it.
	ErrKeyTaken = errors.New("saga: unique key held by another running saga")
	// ErrKeyNotHeld: SignalByKey found no running saga of the type
	// holding the key's value. The event is stored as refused (table
	// saga_event, saga_id ''), with the key it was sent by.
	ErrKeyNotHeld = errors.New("saga: no running saga holds the key")
)

// The kinds of saga_attr rows.
const (
	attrKey       = "key"
	attrUniqueKey = "unique_key"
	attrText      = "text"
	attrNumber    = "number"
	attrTime      = "time"
)

// attrValue is one row of saga_attr as computed from a saga's data: value,
// num or at (by kind) is nil for no value.
type attrValue struct {
	name, kind string
	value      *string
	num        *float64
	at         *time.Time
}

// attrsDef is a definition's keys and attributes, its data type erased.
type attrsDef struct {
	kinds   map[string]string // name -> kind
	unique  bool              // some key is unique
	compute func(data []byte) ([]attrValue, error)
}

// eraseAttrs checks spec's keys and attributes and erases their types;
// nil when it declares none.
func eraseAttrs[D any](keys []Key[D], attrs []Attr[D]) (*attrsDef, error) {
	if len(keys) == 0 && len(attrs) == 0 {
		return nil, nil
	}
	a := &attrsDef{kinds: map[string]string{}}
	add := func(what, name, kind string) error {
		if err := checkName(name); err != nil {
			return fmt.Errorf("%s name %q: %v", what, name, err)
		}
		if _, dup := a.kinds[name]; dup {
			return fmt.Errorf("two keys or attributes are named %q", name)
		}
		a.kinds[name] = kind
		return nil
	}
	for _, k := range keys {
		kind := attrKey
		if k.Unique {
			kind, a.unique = attrUniqueKey, true
		}
		if err := add("key", k.Name, kind); err != nil {
			return nil, err
		}
		if k.Value == nil {
			return nil, fmt.Errorf("key %q has no Value", k.Name)
		}
	}
	for _, at := range attrs {
		kind, set := "", 0
		for _, c := range []struct {
			ok   bool
			kind string
		}{{at.Text != nil, attrText}, {at.Number != nil, attrNumber}, {at.Time != nil, attrTime}} {
			if c.ok {
				kind, set = c.kind, set+1
			}
		}
		if set != 1 {
			return nil, fmt.Errorf("attribute %q: set exactly one of Text, Number and Time", at.Name)
		}
		if err := add("attribute", at.Name, kind); err != nil {
			return nil, err
		}
	}
	keys, attrs = append([]Key[D](nil), keys...), append([]Attr[D](nil), attrs...)
	a.compute = func(data []byte) (vals []attrValue, err error) {
		defer recoverInto(&err)
		var d D
		if err := json.Unmarshal(data, &d); err != nil {
			return nil, fmt.Errorf("saga: decode data: %w", err)
		}
		for _, k := range keys {
			vals = append(vals, attrValue{name: k.Name, kind: a.kinds[k.Name], value: nonEmpty(k.Value(d))})
		}
		for _, at := range attrs {
			v := attrValue{name: at.Name, kind: a.kinds[at.Name]}
			switch {
			case at.Text != nil:
				v.value = nonEmpty(at.Text(d))
			case at.Number != nil:
				if n := at.Number(d); !math.IsNaN(n) {
					v.num = &n
				}
			default:
				if t := at.Time(d); !t.IsZero() {
					v.at = &t
				}
			}
			vals = append(vals, v)
		}
		return vals, nil
	}
	return a, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

type attrStatements struct {
	table string // saga_attr, for the filters (attrConds)
	// save writes a batch of sagas' attributes (upsert); start does the
	// same for a saga being started, without save's skipping of a unique
	// key another saga holds (the start checked it: a race fails it).
	save, start string
	// taken finds a unique key value another running saga holds, on
	// saga_attr_unique_key_idx (type, name, value).
	taken string
	// holders finds the running sagas of a type holding a key's value,
	// on saga_attr_value_idx (name, value, ...).
	holders string
	// of reads a saga's keys and attributes, on the primary key.
	of string
	// drop removes a saga's keys and attributes but the names given, on
	// the primary key.
	drop string
	// release marks the keys and attributes of sagas that ended as not
	// live, on the primary key.
	release string
	// heldBefore finds the state of an event id delivered to a saga that
	// held a key's value (and has ended since): on saga_attr_value_idx,
	// then saga_event_once (saga_id, event_id).
	heldBefore string
}

func newAttrStatements(schema string) attrStatements {
	attr, ev := sqlident.Table(schema, "saga_attr"), sqlident.Table(schema, "saga_event")
	upsert := func(skipTaken string) string {
		return fmt.Sprintf(`INSERT INTO %[1]s AS a (saga_id, name, type, kind, value, num, at, live, created_at)
SELECT u.* FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::float8[], $7::timestamptz[], $8::bool[], $9::timestamptz[])
       AS u(saga_id, name, type, kind, value, num, at, live, created_at)%[2]s
ON CONFLICT (saga_id, name) DO UPDATE SET kind = excluded.kind, value = excluded.value, num = excluded.num, at = excluded.at, live = excluded.live
 WHERE (a.kind, a.value, a.num, a.at, a.live) IS DISTINCT FROM (excluded.kind, excluded.value, excluded.num, excluded.at, excluded.live)`, attr, skipTaken)
	}
	return attrStatements{
		table: attr,
		// A row left as it is changes nothing (no new row version, no
		// index churn): a saga whose data changed no attribute costs one
		// lookup per attribute on the primary key.
		save: upsert(fmt.Sprintf(`
 WHERE u.kind <> 'unique_key' OR u.value IS NULL OR NOT u.live
    OR NOT EXISTS (SELECT 1 FROM %s h WHERE h.type = u.type AND h.name = u.name AND h.value = u.value
                      AND h.kind = 'unique_key' AND h.live AND h.saga_id <> u.saga_id)`, attr)),
		start: upsert(""),
		taken: fmt.Sprintf(`SELECT h.name, h.value, h.saga_id FROM %s h
  JOIN unnest($3::text[], $4::text[]) AS k(name, value) ON h.name = k.name AND h.value = k.value
 WHERE h.type = $1 AND h.kind = 'unique_key' AND h.live AND h.saga_id <> $2
 LIMIT 1`, attr),
		holders: fmt.Sprintf(`SELECT saga_id FROM %s
 WHERE name = $2 AND value = $3 AND type = $1 AND kind IN ('key', 'unique_key') AND live
 ORDER BY saga_id`, attr),
		of:      fmt.Sprintf(`SELECT name, value, num, at FROM %s WHERE saga_id = $1 ORDER BY name`, attr),
		drop:    fmt.Sprintf(`DELETE FROM %s WHERE saga_id = $1 AND name <> ALL($2::text[])`, attr),
		release: fmt.Sprintf(`UPDATE %s SET live = false WHERE saga_id = %s AND live`, attr, sqlident.AnyParam("$1", "text")),
		heldBefore: fmt.Sprintf(`SELECT e.state FROM %s a JOIN %s e ON e.saga_id = a.saga_id AND e.event_id = $4
 WHERE a.name = $2 AND a.value = $3 AND a.type = $1 AND a.kind IN ('key', 'unique_key')
 ORDER BY e.state = 'refused' LIMIT 1`, attr, ev),
	}
}

// attrRows are the saga_attr rows of a statement, column by column.
type attrRows struct {
	ids, names, types, kinds []string
	values                   []*string
	nums                     []*float64
	ats                      []*time.Time
	live                     []bool
	created                  []time.Time
}

func (r *attrRows) add(in *Instance, vals []attrValue) {
	for _, v := range vals {
		r.ids, r.names, r.types, r.kinds = append(r.ids, in.ID), append(r.names, v.name), append(r.types, in.Type), append(r.kinds, v.kind)
		r.values, r.nums, r.ats = append(r.values, v.value), append(r.nums, v.num), append(r.ats, v.at)
		r.live, r.created = append(r.live, in.EndedAt == nil), append(r.created, in.CreatedAt)
	}
}

func (r *attrRows) args() []any {
	return []any{r.ids, r.names, r.types, r.kinds, r.values, r.nums, r.ats, r.live, r.created}
}

// appendAttrStatement appends to before the statement that writes the
// keys and attributes of the sagas of ms that are saved and declare some
// (saveMany), if any does. A definition's function that fails (a panic)
// leaves that saga's attributes as they were, and is logged; if the saga
// ended, its keys are released all the same (release).
func (o *Orchestrator) appendAttrStatement(before []pipeline.Statement, ms []*machine, saveErr *error) []pipeline.Statement {
	var rows attrRows
	var ended []string
	for _, m := range ms {
		if !m.changed() || m.d == nil || m.d.attrs == nil {
			continue
		}
		vals, err := m.d.attrs.compute(m.in.Data)
		if err != nil {
			o.logger.Error("saga: compute keys and attributes; they stay as they were", err, map[string]any{"saga_id": m.in.ID, "type": m.in.Type})
			if m.in.EndedAt != nil {
				ended = append(ended, m.in.ID)
			}
			continue
		}
		rows.add(m.in, vals)
	}
	read := func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			*saveErr = fmt.Errorf("saga: write keys and attributes: %w", err)
		}
		return *saveErr
	}
	if len(ended) > 0 {
		before = append(before, pipeline.Statement{SQL: o.sql.attr.release, Args: []any{ended}, Read: read})
	}
	if len(rows.ids) == 0 {
		return before
	}
	return append(before, pipeline.Statement{SQL: o.sql.attr.save, Args: rows.args(), Read: read})
}

// startAttrs computes the keys and attributes of a saga d is starting with
// data raw and checks its unique keys (none another running saga of the
// type holds, else ErrKeyTaken), before anything is written in tx. It
// returns the values to write once the saga's row is in (writeStartAttrs).
func (o *Orchestrator) startAttrs(ctx context.Context, tx pgx.Tx, d *def, id string, raw []byte) ([]attrValue, error) {
	if d.attrs == nil {
		return nil, nil
	}
	vals, err := d.attrs.compute(raw)
	if err != nil {
		return nil, fmt.Errorf("saga %s: compute keys and attributes: %w", id, err)
	}
	if !d.attrs.unique {
		return vals, nil
	}
	var names, values []string
	for _, v := range vals {
		if v.kind == attrUniqueKey && v.value != nil {
			names, values = append(names, v.name), append(values, *v.value)
		}
	}
	if len(names) == 0 {
		return vals, nil
	}
	var name, value, holder string
	err = tx.QueryRow(ctx, o.sql.attr.taken, d.typ, id, names, values).Scan(&name, &value, &holder)
	switch {
	case err == nil:
		return nil, fmt.Errorf("%w: starting saga %q of type %s: key %s = %q is held by saga %q", ErrKeyTaken, id, d.typ, name, value, holder)
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("saga %s: check unique keys: %w", id, o.tablesError(err))
	}
	return vals, nil
}

// writeStartAttrs writes the keys and attributes of saga in, just
// inserted. A unique key a concurrent start took meanwhile fails it with
// ErrKeyTaken (tx is then aborted).
func (o *Orchestrator) writeStartAttrs(ctx context.Context, tx pgx.Tx, in *Instance, vals []attrValue) error {
	if len(vals) == 0 {
		return nil
	}
	var rows attrRows
	rows.add(in, vals)
	_, err := tx.Exec(ctx, o.sql.attr.start, rows.args()...)
	return o.startAttrsError(in, err)
}

// startAttrStatement is writeStartAttrs as a statement to send ahead of
// the start's commands (pipeline.WriteLast), or nil when in has no keys or
// attributes.
func (o *Orchestrator) startAttrStatement(in *Instance, vals []attrValue) []pipeline.Statement {
	if len(vals) == 0 {
		return nil
	}
	var rows attrRows
	rows.add(in, vals)
	return []pipeline.Statement{{SQL: o.sql.attr.start, Args: rows.args(), Read: func(br pgx.BatchResults) error {
		_, err := br.Exec()
		return o.startAttrsError(in, err)
	}}}
}

// startAttrsError is the error of writing a starting saga's keys and
// attributes: ErrKeyTaken for a unique key a concurrent start took.
func (o *Orchestrator) startAttrsError(in *Instance, err error) error {
	var pe *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pe) && pe.Code == "23505":
		return fmt.Errorf("%w: starting saga %q of type %s: %s", ErrKeyTaken, in.ID, in.Type, pe.Detail)
	}
	return fmt.Errorf("saga %s: write keys and attributes: %w", in.ID, o.tablesError(err))
}

// errInvalidFilter is wrapped by the error for an attribute filter
// (ListParams.Attrs, Query.Attrs) that cannot be read, with
// core.ErrInvalidListParams (List) or ErrInvalidQuery (bulk).
var errInvalidFilter = errors.New("saga: invalid attribute filter")

// attrConds turns attribute filters into conditions on saga_instance's id
// (a subquery of saga_attr), their arguments added through arg. A filter
// is name=value (a key's or a text attribute's value, or a number's or a
// time's when value reads as one), or name>value, >=, <, <= (a number, or
// a time in RFC 3339 or as a date, 2006-01-02, UTC). Equality is answered
// from saga_attr_value_idx (name, value, ...), comparisons from
// saga_attr_num_idx and saga_attr_at_idx (name, num|at).
func attrConds(table string, filters []string, arg func(any) string) ([]string, error) {
	var conds []string
	for _, f := range filters {
		i := strings.IndexAny(f, "=<>")
		if i < 0 {
			return nil, fmt.Errorf("%w: %q: want name=value, or name>value, >=, <, <= for a number or a time", errInvalidFilter, f)
		}
		name, op, value := strings.TrimSpace(f[:i]), f[i:i+1], strings.TrimSpace(f[i+1:])
		if op != "=" && strings.HasPrefix(value, "=") {
			op, value = op+"=", strings.TrimSpace(value[1:])
		}
		if err := checkName(name); err != nil {
			return nil, fmt.Errorf("%w: %q: name: %v", errInvalidFilter, f, err)
		}
		if value == "" || !utf8.ValidString(value) || strings.IndexByte(value, 0) >= 0 {
			return nil, fmt.Errorf("%w: %q: the value is empty, not valid UTF-8 or holds NUL", errInvalidFilter, f)
		}
		num, numErr := strconv.ParseFloat(value, 64)
		at, atErr := parseFilterTime(value)
		var match []string
		if op == "=" {
			match = append(match, "a.value = "+arg(value))
		}
		if numErr == nil && !math.IsNaN(num) && !math.IsInf(num, 0) {
			match = append(match, "a.num "+op+" "+arg(num))
		} else if atErr == nil {
			match = append(match, "a.at "+op+" "+arg(at))
		}
		if len(match) == 0 {
			return nil, fmt.Errorf("%w: %q: %s compares numbers and times (RFC 3339, or a date 2006-01-02): %q is neither", errInvalidFilter, f, op, value)
		}
		conds = append(conds, fmt.Sprintf("id IN (SELECT a.saga_id FROM %s a WHERE a.name = %s AND (%s))", table, arg(name), strings.Join(match, " OR ")))
	}
	return conds, nil
}

func parseFilterTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Parse(time.DateOnly, s)
}

// attributes reads saga id's keys and attributes as Instance.Attributes
// has them; nil when it has none.
func (o *Orchestrator) attributes(ctx context.Context, id string) (map[string]string, error) {
	rows, err := o.pool.Query(ctx, o.sql.attr.of, id)
	if err != nil {
		return nil, fmt.Errorf("read keys and attributes: %w", err)
	}
	var out map[string]string
	var name string
	var value *string
	var num *float64
	var at *time.Time
	_, err = pgx.ForEachRow(rows, []any{&name, &value, &num, &at}, func() error {
		var v string
		switch {
		case value != nil:
			v = *value
		case num != nil:
			v = strconv.FormatFloat(*num, 'g', -1, 64)
		case at != nil:
			v = at.UTC().Format(time.RFC3339Nano)
		default:
			return nil
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = v
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read keys and attributes: %w", err)
	}
	return out, nil
}

// dropUndeclaredAttrs removes saga id's keys and attributes that d does
// not declare (Migrate, to a version that dropped some): a key the
// definition no longer declares is not held.
func (o *Orchestrator) dropUndeclaredAttrs(ctx context.Context, tx pgx.Tx, id string, d *def) error {
	names := []string{}
	if d.attrs != nil {
		for n := range d.attrs.kinds {
			names = append(names, n)
		}
	}
	if _, err := tx.Exec(ctx, o.sql.attr.drop, id, names); err != nil {
		return fmt.Errorf("saga %s: drop keys and attributes v%d does not declare: %w", id, d.version, err)
	}
	return nil
}
