package outbox

import (
	"context"
	"fmt"

	"github.com/millrace/millrace/core"
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
			func(d DeadLetter) bool { return match(d.LastError, d.DeadAt) }, fn)
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

// RequeueMatching requeues (as Requeue) the dead letters q selects, 500
// per transaction, and returns how many it requeued. A dead letter
// requeued or discarded meanwhile by someone else is not counted.
func (a *Admin) RequeueMatching(ctx context.Context, q core.DeadLetterQuery) (int, error) {
	return a.bulk(ctx, q, a.Requeue)
}

// DiscardMatching discards (as Discard) the dead letters q selects, 500
// per transaction, and returns how many it discarded.
func (a *Admin) DiscardMatching(ctx context.Context, q core.DeadLetterQuery) (int, error) {
	return a.bulk(ctx, q, a.Discard)
}

func (a *Admin) bulk(ctx context.Context, q core.DeadLetterQuery, act func(context.Context, ...string) (int, error)) (int, error) {
	return bulk.Apply(a.walkDeadLetters(ctx, q), func(d DeadLetter) string { return d.EventID },
		func(ids ...string) (int, error) { return act(ctx, ids...) })
}
