package inbox

import (
	"context"
	"fmt"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/bulk"
)

// walk calls fn with each page of the dead letters q selects, listed by
// List page by page.
func (d *DeadLetters) walk(ctx context.Context, q core.DeadLetterQuery) func(func([]DeadLetter) error) error {
	match, err := bulk.Match(q.Error, q.DeadBefore)
	if err != nil {
		return bulk.Refuse[DeadLetter](err)
	}
	return func(fn func([]DeadLetter) error) error {
		return bulk.Walk(func(after int64) ([]DeadLetter, error) {
			return d.List(ctx, core.ListParams{Topic: q.Topic, PartitionKey: q.PartitionKey, Limit: bulk.PageSize, AfterID: after})
		}, func(e DeadLetter) int64 { return e.ID },
			func(e DeadLetter) bool {
				return match(e.LastError, e.DeadAt) && (q.EventID == "" || e.EventID == q.EventID)
			}, fn)
	}
}

// DryRun counts the consumer's dead letters q selects and returns the
// first page of them (page dead letters; defaults to 20). It changes
// nothing. It is outbox.Admin.DryRun for an inbox.
func (d *DeadLetters) DryRun(ctx context.Context, q core.DeadLetterQuery, page int) (*core.DryRun[DeadLetter], error) {
	n, first, err := bulk.DryRun(d.walk(ctx, q), page)
	if err != nil {
		return nil, fmt.Errorf("inbox: dry run on dead letters of %s: %w", d.consumer, err)
	}
	return &core.DryRun[DeadLetter]{Count: n, First: first}, nil
}

// RequeueMatching requeues (as Requeue, by by) the consumer's dead
// letters q selects, 500 per transaction, and returns how many it
// requeued. A dead letter requeued or discarded meanwhile by someone else
// is not counted.
func (d *DeadLetters) RequeueMatching(ctx context.Context, q core.DeadLetterQuery, by core.Actor) (int, error) {
	if err := audit.Check(by, "inbox: requeue dead letters of "+d.consumer); err != nil {
		return 0, err
	}
	return bulk.Apply(d.walk(ctx, q), deadEventID, func(ids ...string) (int, error) { return d.Requeue(ctx, by, ids...) })
}

// DiscardMatching discards (as Discard, by by) the consumer's dead
// letters q selects, 500 per transaction, and returns how many it
// discarded. A dead letter requeued or discarded meanwhile by someone else
// is not counted.
func (d *DeadLetters) DiscardMatching(ctx context.Context, q core.DeadLetterQuery, by core.Actor) (int, error) {
	if err := audit.Check(by, "inbox: discard dead letters of "+d.consumer); err != nil {
		return 0, err
	}
	return bulk.Apply(d.walk(ctx, q), deadEventID, func(ids ...string) (int, error) { return d.Discard(ctx, by, ids...) })
}

func deadEventID(e DeadLetter) string { return e.EventID }
