package outbox

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/bulk"
)

// walkDeadLetters calls fn with each page of the dead letters q selects,
// listed by List page by page.
func (a *Admin) walkDeadLetters(ctx context.Context, q core.DeadLetterQuery) func(func([]DeadLetter) error) error {
	match, err := bulk.Match(q.Error, q.DeadBefore)
	if err != nil {
		return bulk.Refuse[DeadLetter](err)
	}
	return func(fn func([]DeadLetter) error) error {
		return bulk.Walk(func(after int64) ([]DeadLetter, error) {
			return a.List(ctx, core.ListParams{Topic: q.Topic, PartitionKey: q.PartitionKey, Limit: bulk.PageSize, AfterID: after})
		}, func(d DeadLetter) int64 { return d.ID },
			func(d DeadLetter) bool {
				return match(d.LastError, d.DeadAt) && (q.EventID == "" || d.EventID == q.EventID)
			}, fn)
	}
}

// DryRun counts the dead letters q selects and returns the
// first page of them (page dead letters; defaults to 20). It changes
// nothing.
func (a *Admin) DryRun(ctx context.Context, q core.DeadLetterQuery, page int) (*core.DryRun[DeadLetter], error) {
	n, first, err := bulk.DryRun(a.walkDeadLetters(ctx, q), page)
	if err != nil {
		return nil, fmt.Errorf("outbox: dry run on dead letters: %w", err)
	}
	return &core.DryRun[DeadLetter]{Count: n, First: first}, nil
}

// RequeueMatching requeues (as Requeue, by by) the dead letters q
// selects, 500 per transaction, and returns how many it requeued: only the
// rows selected, so of an event id written to several topics only the
// copies of the topic selected (q.Topic; q.EventID with q.Topic names one
// copy). Each is recorded in the audit trail in its transaction. A dead
// letter requeued or discarded meanwhile by someone else is not counted.
func (a *Admin) RequeueMatching(ctx context.Context, q core.DeadLetterQuery, by core.Actor) (int, error) {
	return a.bulk(ctx, q, by, "requeue", a.sql.requeueRows)
}

// DiscardMatching discards (as Discard, by by) the dead letters q selects,
// 500 per transaction, and returns how many it discarded: only the rows
// selected, as RequeueMatching.
func (a *Admin) DiscardMatching(ctx context.Context, q core.DeadLetterQuery, by core.Actor) (int, error) {
	return a.bulk(ctx, q, by, "discard", a.sql.discardRows)
}

// bulk requeues or discards (op, with sql) the dead letters q selects by
// their row ids: one event id can be a dead letter in several topics (a
// fan-out), and only the copies selected are acted on (Requeue and
// Discard, given an id, act on every copy).
func (a *Admin) bulk(ctx context.Context, q core.DeadLetterQuery, by core.Actor, op, sql string) (int, error) {
	if err := audit.Check(by, "outbox: bulk "+op); err != nil {
		return 0, err
	}
	return bulk.Apply(a.walkDeadLetters(ctx, q), func(d DeadLetter) int64 { return d.ID }, func(ids ...int64) (int, error) {
		var entries []audit.Entry
		err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
			var err error
			entries, err = a.deadLetterOpTx(ctx, tx, op, sql, ids, by)
			return err
		})
		if err != nil {
			return 0, err
		}
		audit.Count(entries...)
		return len(entries), nil
	})
}
