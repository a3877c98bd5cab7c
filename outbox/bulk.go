package outbox

import (
	"context"
	"fmt"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/bulk"
)

// DeadLetterQuery selects dead letters for a bulk requeue or discard
// (Admin.DryRunDeadLetters, RequeueMatching, DiscardMatching); see
// core.DeadLetterQuery.
type DeadLetterQuery = core.DeadLetterQuery

// DeadLetterDryRun is what a bulk action on a DeadLetterQuery would act on.
type DeadLetterDryRun struct {
	Count int
	// First are the first dead letters selected, in row id order.
	First []DeadLetter
}

// walkDeadLetters calls fn with each page of the dead letters q selects,
// listed by ListDeadLetters page by page.
func (a *Admin) walkDeadLetters(ctx context.Context, q DeadLetterQuery) func(func([]DeadLetter) error) error {
	match := bulk.Match(q.Error, q.DeadBefore)
	return func(fn func([]DeadLetter) error) error {
		return bulk.Walk(func(after int64) ([]DeadLetter, error) {
			return a.ListDeadLetters(ctx, ListParams{Topic: q.Topic, PartitionKey: q.PartitionKey, Limit: bulk.PageSize, AfterID: after})
		}, func(d DeadLetter) int64 { return d.ID },
			func(d DeadLetter) bool { return match(d.LastError, d.DeadAt) }, fn)
	}
}

// DryRunDeadLetters counts the dead letters q selects and returns the
// first page of them (page dead letters; defaults to 20). It changes
// nothing.
func (a *Admin) DryRunDeadLetters(ctx context.Context, q DeadLetterQuery, page int) (*DeadLetterDryRun, error) {
	n, first, err := bulk.DryRun(a.walkDeadLetters(ctx, q), page)
	if err != nil {
		return nil, fmt.Errorf("outbox: dry run on dead letters: %w", err)
	}
	return &DeadLetterDryRun{Count: n, First: first}, nil
}

// RequeueMatching requeues (as Requeue) the dead letters q selects, 500
// per transaction, and returns how many it requeued. A dead letter
// requeued or discarded meanwhile by someone else is not counted.
func (a *Admin) RequeueMatching(ctx context.Context, q DeadLetterQuery) (int, error) {
	return a.bulk(ctx, q, a.Requeue)
}

// DiscardMatching discards (as Discard) the dead letters q selects, 500
// per transaction, and returns how many it discarded.
func (a *Admin) DiscardMatching(ctx context.Context, q DeadLetterQuery) (int, error) {
	return a.bulk(ctx, q, a.Discard)
}

func (a *Admin) bulk(ctx context.Context, q DeadLetterQuery, act func(context.Context, ...string) (int, error)) (int, error) {
	return bulk.Apply(a.walkDeadLetters(ctx, q), func(d DeadLetter) string { return d.EventID },
		func(ids ...string) (int, error) { return act(ctx, ids...) })
}
