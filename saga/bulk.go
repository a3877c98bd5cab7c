package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/sqlident"
)

// Query selects sagas for a bulk action (Operator.DryRun, Plan and Bulk).
// Every condition set must hold; at least one of Type, Status, Step, Error
// and Attrs must be set.
type Query struct {
	// Type, if set, keeps only sagas of this type.
	Type string `json:"type,omitempty"`
	// Status, if set, keeps only sagas in this status.
	Status Status `json:"status,omitempty"`
	// Step, if set, keeps only sagas whose current step is this one.
	Step string `json:"step,omitempty"`
	// CreatedBefore, if set, keeps only sagas created before it (older
	// than an age).
	CreatedBefore time.Time `json:"created_before,omitzero"`
	// UpdatedBefore, if set, keeps only sagas unchanged since before it
	// (idle for longer than an age).
	UpdatedBefore time.Time `json:"updated_before,omitzero"`
	// Error, if set, keeps only sagas whose last error matches this SQL
	// LIKE pattern ("%refund hold%": % is any run of characters, _ any one
	// character, \ escapes them).
	Error string `json:"error,omitempty"`
	// Attrs, if set, keeps only sagas whose keys and search attributes
	// (Spec.Keys, Spec.Attributes) match every filter, as ListParams.Attrs
	// ("customer=ada", "amount>100").
	Attrs []string `json:"attrs,omitempty"`
	// Limit, if positive, selects at most this many sagas, the newest.
	// Defaults to 0: every matching saga.
	Limit int `json:"limit,omitempty"`
}

// ErrInvalidQuery is returned for a Query that selects nothing in
// particular (no Type, Status, Step, Error or Attrs), has a negative Limit
// or an attribute filter it cannot read.
var ErrInvalidQuery = errors.New("saga: invalid bulk query")

// where is the query's WHERE clause on saga_instance, its arguments added
// through arg; attrs is the saga_attr table. The selection relies on
// saga_instance_status_step_idx (status, step, ...) of migration 011, the
// indexes of migration 005 on type and status, or saga_attr's (attrConds).
func (q Query) where(attrs string, arg func(any) string) (string, error) {
	if q.Type == "" && q.Status == "" && q.Step == "" && q.Error == "" && len(q.Attrs) == 0 {
		return "", fmt.Errorf("%w: set at least one of type, status, step, error and attrs", ErrInvalidQuery)
	}
	if q.Limit < 0 {
		return "", fmt.Errorf("%w: negative limit %d", ErrInvalidQuery, q.Limit)
	}
	var conds []string
	if q.Type != "" {
		conds = append(conds, "type = "+arg(q.Type))
	}
	if q.Status != "" {
		conds = append(conds, "status = "+arg(string(q.Status)))
	}
	if q.Step != "" {
		conds = append(conds, "step = "+arg(q.Step))
	}
	if !q.CreatedBefore.IsZero() {
		conds = append(conds, "created_at < "+arg(q.CreatedBefore))
	}
	if !q.UpdatedBefore.IsZero() {
		conds = append(conds, "updated_at < "+arg(q.UpdatedBefore))
	}
	if q.Error != "" {
		conds = append(conds, "last_error LIKE "+arg(q.Error))
	}
	ac, err := attrConds(attrs, q.Attrs, arg) // attr.go
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidQuery, err)
	}
	return "WHERE " + strings.Join(append(conds, ac...), " AND "), nil
}

// selectIDs is the query's selection: ids and revisions, the newest
// first when limited.
func (q Query) selectIDs(table, attrs string, arg func(any) string) (string, error) {
	where, err := q.where(attrs, arg)
	if err != nil {
		return "", err
	}
	s := fmt.Sprintf(`SELECT id, version FROM %s %s`, table, where)
	if q.Limit > 0 {
		s += " ORDER BY created_at DESC, id DESC LIMIT " + arg(q.Limit)
	}
	return s, nil
}

func args() (*[]any, func(any) string) {
	var list []any
	return &list, func(v any) string {
		list = append(list, v)
		return fmt.Sprintf("$%d", len(list))
	}
}

// DryRun counts the sagas q selects and returns the newest page of them
// (page sagas; defaults to 20 when page <= 0, at most 1000). It changes
// nothing.
func (o *Orchestrator) DryRun(ctx context.Context, q Query, page int) (*core.DryRun[*Instance], error) {
	if page <= 0 {
		page = 20
	}
	page = min(page, 1000)
	list, arg := args()
	sel, err := q.selectIDs(o.sql.instance, o.sql.attr.table, arg)
	if err != nil {
		return nil, err
	}
	d := &core.DryRun[*Instance]{}
	err = pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (`+sel+`) s`, *list...).Scan(&d.Count); err != nil {
			return err
		}
		d.First, err = o.sample(ctx, tx, q, page)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("saga: bulk dry run: %w", err)
	}
	return d, nil
}

// sample returns the newest n sagas q selects.
func (o *Orchestrator) sample(ctx context.Context, tx pgx.Tx, q Query, n int) ([]*Instance, error) {
	list, arg := args()
	where, err := q.where(o.sql.attr.table, arg)
	if err != nil {
		return nil, err
	}
	if q.Limit > 0 {
		n = min(n, q.Limit)
	}
	return queryInstances(ctx, tx, fmt.Sprintf(`SELECT %s FROM %s %s ORDER BY created_at DESC, id DESC LIMIT %s`,
		instanceCols, o.sql.instance, where, arg(n)), *list...)
}

// Why a bulk operation's saga was refused (BulkCounts.Refused). At filing
// (Operator.Apply): refusedChanged, refusedNotAllowed,
// refusedRequestPending, refusedNotFound. When the orchestrator came to
// apply the request: refusedChanged, refusedNotAllowed,
// refusedNotRegistered, refusedFailed (dropped after
// Config.MaxTimerFailures technical failures), refusedWithdrawn
// (Operator.Withdraw).
const (
	// refusedChanged: the saga changed (its revision) since it was
	// selected, or since its request was filed: the operator decided on
	// a state that is gone.
	refusedChanged = "changed"
	// refusedNotAllowed: the saga's state does not allow the action.
	refusedNotAllowed = "not_allowed"
	// refusedRequestPending: another operator request waits on the saga.
	refusedRequestPending = "request_pending"
	// refusedNotFound: the saga is gone (removed by retention).
	refusedNotFound = "not_found"
	// refusedNotRegistered: no orchestrator has the saga's definition.
	refusedNotRegistered = "not_registered"
	// refusedFailed: carrying it out failed technically too often.
	refusedFailed = "failed"
	// refusedWithdrawn: an operator withdrew the filed request.
	refusedWithdrawn = "withdrawn"
)

// BulkCounts are a bulk operation's progress and outcome counts.
type BulkCounts struct {
	// Selected is how many sagas the query selected.
	Selected int64 `json:"selected"`
	// Unfiled are selected sagas whose request is not filed yet (Apply
	// has not run, or is running).
	Unfiled int64 `json:"unfiled"`
	// Filed is how many requests were filed: Applied, Pending, and those
	// the orchestrator refused.
	Filed int64 `json:"filed"`
	// Pending are filed requests the orchestrator has not come to yet.
	Pending int64 `json:"pending"`
	// Applied are requests the orchestrator carried out.
	Applied int64 `json:"applied"`
	// Refused counts the refused sagas by reason (refusedChanged, ...),
	// at filing or when the orchestrator came to apply them.
	Refused map[string]int64 `json:"refused"`
}

// RefusedTotal is the number of refused sagas, for every reason.
func (c BulkCounts) RefusedTotal() int64 {
	var n int64
	for _, v := range c.Refused {
		n += v
	}
	return n
}

// BulkOperation is a bulk action on the sagas a query selected, as
// recorded by Orchestrator.Plan (or Bulk).
type BulkOperation struct {
	ID     string `json:"id"`
	Action Action `json:"action"`
	// Operator planned it, for Reason.
	Operator string `json:"operator"`
	Reason   string `json:"reason"`
	// ConfirmedBy is the operator who first confirmed it (Apply): its
	// requests are filed in their name, on behalf of Operator; "" before.
	ConfirmedBy string    `json:"confirmed_by,omitempty"`
	Query       Query     `json:"query"`
	Created     time.Time `json:"created_at"`
	// Filed is when the last request was filed; nil before (a plan not
	// applied yet, or Apply under way).
	Filed  *time.Time `json:"filed_at"`
	Counts BulkCounts `json:"counts"`
	// Sample is, from Plan and Bulk, the newest selected sagas as they
	// were selected (at most 20); nil from BulkStatus and Apply.
	Sample []*Instance `json:"-"`
}

// Done reports whether every selected saga has its outcome: filed,
// and applied or refused.
func (b *BulkOperation) Done() bool {
	return b.Filed != nil && b.Counts.Unfiled == 0 && b.Counts.Pending == 0
}

// ErrBulkNotFound is returned for an unknown bulk operation id.
var ErrBulkNotFound = errors.New("saga: no such bulk operation")

// bulkBatch is how many requests Apply files per transaction.
const bulkBatch = 500

// Plan records a bulk operation: action on every saga q selects now, by
// (who and why, both required), with the selected sagas and their
// revisions, and returns it with its counts and a sample of the sagas. It
// files nothing: Apply does. A saga that changes before Apply files its
// request is refused (refusedChanged), not acted on. It returns an error
// wrapping ErrInvalidQuery for a bad query and ErrActionNotAllowed for an
// unknown action or an incomplete Actor.
func (o *Orchestrator) Plan(ctx context.Context, action Action, q Query, by Actor) (*BulkOperation, error) {
	if action.op() == nil {
		return nil, fmt.Errorf("%w: unknown action %q", ErrActionNotAllowed, action)
	}
	if err := noActor(by); err != nil {
		return nil, fmt.Errorf("%w: bulk %s: %w", ErrActionNotAllowed, action, err)
	}
	list, arg := args()
	arg(nil) // $1: the operation id
	sel, err := q.selectIDs(o.sql.instance, o.sql.attr.table, arg)
	if err != nil {
		return nil, err
	}
	rawQuery, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	b := &BulkOperation{ID: uuid.NewString(), Action: action, Operator: clean(by.Operator), Reason: oneLine(by.Reason),
		Query: q, Created: o.clock.Now()}
	(*list)[0] = b.ID
	bs := &o.sql.bulk
	item := sqlident.Table(o.schema, "saga_bulk_item")
	var planned audit.Entry
	err = pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, bs.insertOp, b.ID, string(action), b.Operator, b.Reason, rawQuery, b.Created); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (operation_id, saga_id, revision) SELECT $1, id, version FROM (%s) s`, item, sel), *list...)
		if err != nil {
			return err
		}
		b.Counts = BulkCounts{Selected: tag.RowsAffected(), Unfiled: tag.RowsAffected(), Refused: map[string]int64{}}
		if _, err := tx.Exec(ctx, bs.setSelected, b.ID, b.Counts.Selected); err != nil {
			return err
		}
		if b.Sample, err = o.sample(ctx, tx, q, 20); err != nil {
			return err
		}
		planned = audit.Entry{Actor: by, Action: "saga.bulk.plan", Kind: audit.KindSagaBulk, Scope: q.Type, Target: b.ID,
			Detail: map[string]any{"action": action, "query": q, "selected": b.Counts.Selected}}
		planned.Actor.Operation = b.ID
		return o.trail.Write(ctx, tx, planned)
	})
	if err != nil {
		return nil, fmt.Errorf("saga: bulk %s: plan: %w", action, err)
	}
	audit.Count(planned)
	return b, nil
}

// Apply confirms the operation: it files its operator requests in the
// name of by, the one who confirms (who and why, both required; the
// operation's planner, when someone else, is recorded as the requests'
// OnBehalfOf, in the sagas' history and the audit trail), bulkBatch sagas
// per transaction, and returns the operation with its counts. Each saga
// is checked against its own state first, under its row lock: one that
// changed since it was selected (refusedChanged), whose state refuses the
// action (refusedNotAllowed), that has another request pending
// (refusedRequestPending) or is gone (refusedNotFound) is refused,
// counted, and not acted on, with an "operator_refused" history line;
// each other saga gets its request as Request records it, naming the
// operation, for the running orchestrator to apply (which checks it
// again: see Request). Apply again after a failure or a crash goes on
// where it stopped; Apply of an operation filed already files nothing. It
// returns an error wrapping ErrBulkNotFound for an unknown id, and
// ErrActionNotAllowed for an incomplete Actor.
func (o *Orchestrator) Apply(ctx context.Context, id string, by Actor) (*BulkOperation, error) {
	if err := noActor(by); err != nil {
		return nil, fmt.Errorf("%w: bulk operation %s: %w", ErrActionNotAllowed, id, err)
	}
	b, err := o.BulkStatus(ctx, id)
	if err != nil {
		return nil, err
	}
	by.Operation, by.Revision, by.OnBehalfOf = b.ID, 0, ""
	if clean(by.Operator) != b.Operator {
		by.OnBehalfOf = b.Operator
	}
	bs := &o.sql.bulk
	if _, err := o.pool.Exec(ctx, bs.confirm, b.ID, clean(by.Operator)); err != nil {
		return nil, fmt.Errorf("saga: bulk %s %s: confirm: %w", b.Action, b.ID, err)
	}
	for {
		n := 0
		var counts []func()
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			counts = counts[:0]
			rows, err := tx.Query(ctx, bs.pick, b.ID, bulkBatch)
			if err != nil {
				return err
			}
			type picked struct {
				id  string
				rev int64
			}
			items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (picked, error) {
				var it picked
				return it, row.Scan(&it.id, &it.rev)
			})
			if err != nil {
				return err
			}
			n = len(items)
			ids, states, reasons, errs := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
			for i, it := range items {
				ids[i], states[i] = it.id, "filed"
				reason, count, ferr := o.file(ctx, tx, b, it.id, it.rev, by)
				if reason == "" && ferr != nil {
					return ferr
				}
				counts = append(counts, count)
				if reason != "" {
					states[i], reasons[i], errs[i] = "refused", reason, ferr.Error()
				}
			}
			if n == 0 {
				_, err := tx.Exec(ctx, bs.setFiled, b.ID, o.clock.Now())
				return err
			}
			_, err = tx.Exec(ctx, bs.settle, b.ID, o.clock.Now(), ids, states, reasons, errs)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("saga: bulk %s %s: file requests: %w", b.Action, b.ID, err)
		}
		for _, count := range counts {
			count()
		}
		if n == 0 {
			break
		}
	}
	return o.BulkStatus(ctx, id)
}

// file files the request of one saga of b, selected at revision rev, as
// by. It returns the refusal's reason and error, or "" and a technical
// error (or nil once filed), and what counts its audit entry once tx
// commits.
func (o *Orchestrator) file(ctx context.Context, tx pgx.Tx, b *BulkOperation, id string, rev int64, by Actor) (string, func(), error) {
	in, err := o.lock(ctx, tx, id)
	if errors.Is(err, ErrNotFound) {
		return refusedNotFound, func() {}, err
	}
	if err != nil {
		return "", nil, err
	}
	var reason string
	if in.Revision != rev && in.Request == nil { // a pending request bumps the revision too: say that instead
		reason = refusedChanged
		err = fmt.Errorf("%w: %s of saga %q: it changed since it was selected (revision %d, now %d): look again and plan a new bulk action",
			ErrActionNotAllowed, b.Action, id, rev, in.Revision)
	} else {
		var count func()
		_, count, err = o.requestTx(ctx, tx, id, b.Action, by)
		switch {
		case err == nil:
			return "", count, nil
		case errors.Is(err, ErrRequestPending):
			reason = refusedRequestPending
		case errors.Is(err, ErrActionNotAllowed):
			reason = refusedNotAllowed
		default:
			return "", nil, err
		}
	}
	detail, _ := json.Marshal(map[string]any{"action": b.Action, "operation": b.ID, "error": err.Error(), "on_behalf_of": by.OnBehalfOf})
	herr := o.writeHistory(ctx, tx, []historyRow{{sagaID: id, at: o.clock.Now(), event: "operator_refused", step: in.Step,
		actor: by.Operator, reason: by.Reason, status: string(in.Status), detail: detail}})
	if herr != nil {
		return "", nil, herr
	}
	count, herr := o.auditSaga(ctx, tx, by, string(b.Action), audit.Refused, in, state(in), nil,
		map[string]string{"refused": reason, "error": err.Error()})
	if herr != nil {
		return "", nil, herr
	}
	return reason, count, err
}

// Bulk is Plan then Apply, both by by: it selects the sagas q selects now
// and files action's request on each (see Apply).
func (o *Orchestrator) Bulk(ctx context.Context, action Action, q Query, by Actor) (*BulkOperation, error) {
	b, err := o.Plan(ctx, action, q, by)
	if err != nil {
		return nil, err
	}
	sample := b.Sample
	if b, err = o.Apply(ctx, b.ID, by); err != nil {
		return nil, err
	}
	b.Sample = sample
	return b, nil
}

// BulkStatus returns a bulk operation with its progress and outcome
// counts now. It returns an error wrapping ErrBulkNotFound for an unknown
// id.
func (o *Orchestrator) BulkStatus(ctx context.Context, id string) (*BulkOperation, error) {
	bs := &o.sql.bulk
	b := &BulkOperation{Counts: BulkCounts{Refused: map[string]int64{}}}
	var action string
	var rawQuery []byte
	err := pgx.BeginTxFunc(ctx, o.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, bs.getOp, id).Scan(&b.ID, &action, &b.Operator, &b.Reason, &rawQuery, &b.Created, &b.Filed, &b.Counts.Selected,
			&b.ConfirmedBy)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrBulkNotFound, id)
		}
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, bs.counts, id)
		if err != nil {
			return err
		}
		var state, reason string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&state, &reason, &n}, func() error {
			switch state {
			case "selected":
				b.Counts.Unfiled += n
			case "filed":
				b.Counts.Filed += n
				b.Counts.Pending += n
			case "applied":
				b.Counts.Filed += n
				b.Counts.Applied += n
			case "refused":
				b.Counts.Refused[reason] += n
			case "refused_on_apply":
				b.Counts.Refused[reason] += n
				b.Counts.Filed += n
			}
			return nil
		})
		return err
	})
	if errors.Is(err, ErrBulkNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("saga: bulk operation %s: %w", id, err)
	}
	b.Action = Action(action)
	if err := json.Unmarshal(rawQuery, &b.Query); err != nil {
		return nil, fmt.Errorf("saga: bulk operation %s: decode query: %w", id, err)
	}
	return b, nil
}

// bulkOutcome records on the bulk operation that filed r, if any, what the
// orchestrator did with it: applied (refused nil) or refused, and why.
// applyRequests (operator.go) calls it, in its transaction, for every
// request it clears.
func (o *Orchestrator) bulkOutcome(ctx context.Context, tx pgx.Tx, in *Instance, r *Request, refused error) error {
	if r.Operation == "" {
		return nil
	}
	state, reason, msg := "applied", "", ""
	if refused != nil {
		state, msg = "refused_on_apply", refused.Error()
		switch {
		case stale(in, r) != nil:
			reason = refusedChanged
		case errors.Is(refused, ErrNotRegistered):
			reason = refusedNotRegistered
		case refusal(refused):
			reason = refusedNotAllowed
		default:
			reason = refusedFailed
		}
	}
	return o.settleBulk(ctx, tx, r.Operation, in.ID, state, reason, msg)
}

func (o *Orchestrator) settleBulk(ctx context.Context, tx pgx.Tx, operation, id, state, reason, msg string) error {
	if _, err := tx.Exec(ctx, o.sql.bulk.outcome, operation, id, state, reason, msg, o.clock.Now()); err != nil {
		return fmt.Errorf("saga %s: record the outcome on bulk operation %s: %w", id, operation, err)
	}
	return nil
}

// operatorDetail is the detail of an "operator" history line: the action,
// the bulk operation it is part of if any, and the planner of that
// operation when someone else confirmed it (by.OnBehalfOf).
func operatorDetail(action string, by Actor) []byte {
	d := struct {
		Action     string `json:"action"`
		Operation  string `json:"operation,omitempty"`
		OnBehalfOf string `json:"on_behalf_of,omitempty"`
	}{action, by.Operation, clean(by.OnBehalfOf)}
	raw, _ := json.Marshal(d)
	return raw
}

// BulkSagas returns up to limit of the sagas a bulk operation selected,
// as they are now, in id order (on the primary keys); a saga deleted since
// is left out. limit defaults to 20 when <= 0, at most 1000.
func (o *Orchestrator) BulkSagas(ctx context.Context, id string, limit int) ([]*Instance, error) {
	if limit <= 0 {
		limit = 20
	}
	limit = min(limit, 1000)
	q := fmt.Sprintf(`SELECT %s FROM %s WHERE id IN (SELECT saga_id FROM %s WHERE operation_id = $1 ORDER BY saga_id LIMIT $2) ORDER BY id`,
		instanceCols, o.sql.instance, sqlident.Table(o.schema, "saga_bulk_item"))
	sagas, err := queryInstances(ctx, o.pool, q, id, limit)
	if err != nil {
		return nil, fmt.Errorf("saga: bulk operation %s: sagas: %w", id, err)
	}
	return sagas, nil
}
