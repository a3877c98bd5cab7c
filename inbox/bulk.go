package inbox

import (
	"context"
	"fmt"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/bulk"
)

// DeadLetterQuery selects an inbox's dead letters for a bulk requeue or
// discard (DeadLetters.DryRun, RequeueMatching, DiscardMatching); see
// core.DeadLetterQuery. It is the outbox's query too.
type DeadLetterQuery = core.DeadLetterQuery

// DeadLetterDryRun is what a bulk action on a DeadLetterQuery would act on.
type DeadLetterDryRun struct {
	Count int
	// First are the first dead letters selected, in arrival (row id) order.
	First []DeadEvent
}

// walk calls fn with each page of the dead letters q selects, listed by
// List page by page.
func (d *DeadLetters) walk(ctx context.Context, q DeadLetterQuery) func(func([]DeadEvent) error) error {
	match := bulk.Match(q.Error, q.DeadBefore)
	return func(fn func([]DeadEvent) error) error {
		return bulk.Walk(func(after int64) ([]DeadEvent, error) {
			return d.List(ctx, core.ListParams{Topic: q.Topic, PartitionKey: q.PartitionKey, Limit: bulk.PageSize, AfterID: after})
		}, func(e DeadEvent) int64 { return e.ID },
			func(e DeadEvent) bool { return match(e.LastError, e.DeadAt) }, fn)
	}
}

// DryRun counts the consumer's dead letters q selects and returns the
// first page of them (page dead letters; defaults to 20). It changes
// nothing. It is outbox.Admin.DryRunDeadLetters for an inbox.
func (d *DeadLetters) DryRun(ctx context.Context, q DeadLetterQuery, page int) (*DeadLetterDryRun, error) {
	n, first, err := bulk.DryRun(d.walk(ctx, q), page)
	if err != nil {
		return nil, fmt.Errorf("inbox: dry run on dead letters of %s: %w", d.consumer, err)
	}
	return &DeadLetterDryRun{Count: n, First: first}, nil
}

// RequeueMatching requeues (as Requeue) the consumer's dead letters q
// selects, 500 per transaction, and returns how many it requeued. A dead
// letter requeued or discarded meanwhile by someone else is not counted.
func (d *DeadLetters) RequeueMatching(ctx context.Context, q DeadLetterQuery) (int, error) {
	return bulk.Apply(d.walk(ctx, q), deadEventID, func(ids ...string) (int, error) { return d.Requeue(ctx, ids...) })
}

// DiscardMatching discards (as Discard) the consumer's dead letters q
// selects, 500 per transaction, and returns how many it discarded. A dead
// letter requeued or discarded meanwhile by someone else is not counted.
func (d *DeadLetters) DiscardMatching(ctx context.Context, q DeadLetterQuery) (int, error) {
	return bulk.Apply(d.walk(ctx, q), deadEventID, func(ids ...string) (int, error) { return d.Discard(ctx, ids...) })
}

func deadEventID(e DeadEvent) string { return e.EventID }
