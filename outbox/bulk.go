package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/millrace/millrace/internal/like"
)

// DeadLetterQuery selects dead letters for a bulk requeue or discard
// (Admin.DryRunDeadLetters, RequeueMatching, DiscardMatching). Every
// condition set must hold; the zero value selects every dead letter.
type DeadLetterQuery struct {
	// Topic and PartitionKey keep only dead letters of this topic or key
	// (matched in SQL by the listing, as ListParams). Defaults to any.
	Topic, PartitionKey string
	// Error keeps only dead letters whose last error matches this SQL LIKE
	// pattern ("%timeout%"). Defaults to any.
	Error string
	// DeadBefore keeps only dead letters that died before it (older than
	// an age). Defaults to any.
	DeadBefore time.Time
}

// DeadLetterDryRun is what a bulk action on a DeadLetterQuery would act on.
type DeadLetterDryRun struct {
	Count int
	// First are the first dead letters selected, in row id order.
	First []DeadLetter
}

// bulkPage is how many dead letters a bulk action lists, and requeues or
// discards, at a time.
const bulkPage = 500

// walkDeadLetters calls fn with each page of the dead letters q selects,
// listed by ListDeadLetters page by page.
func (a *Admin) walkDeadLetters(ctx context.Context, q DeadLetterQuery, fn func([]DeadLetter) error) error {
	var match func(string) bool
	if q.Error != "" {
		match = like.Compile(q.Error).MatchString
	}
	p := ListParams{Topic: q.Topic, PartitionKey: q.PartitionKey, Limit: bulkPage}
	for {
		list, err := a.ListDeadLetters(ctx, p)
		if err != nil {
			return err
		}
		if len(list) == 0 {
			return nil
		}
		p.AfterID = list[len(list)-1].ID
		keep := list[:0]
		for _, d := range list {
			if (match == nil || match(d.LastError)) && (q.DeadBefore.IsZero() || d.DeadAt.Before(q.DeadBefore)) {
				keep = append(keep, d)
			}
		}
		if len(keep) > 0 {
			if err := fn(keep); err != nil {
				return err
			}
		}
	}
}

// DryRunDeadLetters counts the dead letters q selects and returns the
// first page of them (page dead letters; defaults to 20). It changes
// nothing.
func (a *Admin) DryRunDeadLetters(ctx context.Context, q DeadLetterQuery, page int) (*DeadLetterDryRun, error) {
	if page <= 0 {
		page = 20
	}
	d := &DeadLetterDryRun{}
	err := a.walkDeadLetters(ctx, q, func(list []DeadLetter) error {
		d.Count += len(list)
		if n := min(page-len(d.First), len(list)); n > 0 {
			d.First = append(d.First, list[:n]...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: dry run on dead letters: %w", err)
	}
	return d, nil
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
	total := 0
	err := a.walkDeadLetters(ctx, q, func(list []DeadLetter) error {
		ids := make([]string, len(list))
		for i, d := range list {
			ids[i] = d.EventID
		}
		n, err := act(ctx, ids...)
		total += n
		return err
	})
	return total, err
}
