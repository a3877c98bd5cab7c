// Package bulk walks a dead-letter listing page by page for the bulk
// actions by query (the outbox's and the inboxes' dead letters, poison
// topics): the conditions the listing cannot serve in SQL, a last-error
// LIKE match and an age, are applied here, in Go, so the actions reuse the
// listings and the single-item Requeue and Discard and copy no SQL.
package bulk

import (
	"fmt"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/like"
)

// PageSize is how many dead letters a bulk action lists, and acts on, at
// a time (one transaction per page).
const PageSize = 500

// List returns p with its defaults applied (DefaultListLimit), or an error
// wrapping core.ErrInvalidListParams when Limit or AfterID is negative:
// the outbox's and the inboxes' listings read their params with it.
func List(p core.ListParams) (core.ListParams, error) {
	if p.Limit < 0 || p.AfterID < 0 {
		return p, fmt.Errorf("%w: Limit %d and AfterID %d must not be negative", core.ErrInvalidListParams, p.Limit, p.AfterID)
	}
	if p.Limit == 0 {
		p.Limit = core.DefaultListLimit
	}
	return p, nil
}

// Match returns whether a dead letter's text (its last error, a poison
// reason) and time (when it died, was poisoned) satisfy a selection:
// text matches the SQL LIKE pattern (any text when pattern is empty) and
// at is before before (any time when before is zero). A pattern
// PostgreSQL's LIKE refuses is an error wrapping
// core.ErrInvalidListParams.
func Match(pattern string, before time.Time) (func(text string, at time.Time) bool, error) {
	var match func(string) bool
	if pattern != "" {
		re, err := like.Compile(pattern)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", core.ErrInvalidListParams, err)
		}
		match = re.MatchString
	}
	return func(text string, at time.Time) bool {
		return (match == nil || match(text)) && (before.IsZero() || at.Before(before))
	}, nil
}

// Refuse is a walk that fails at once with err (a selection Match
// refused).
func Refuse[T any](err error) func(fn func([]T) error) error {
	return func(func([]T) error) error { return err }
}

// Walk pages through a listing in row id order: list returns up to
// PageSize rows after a row id (none at the end), id gives a row's id, and
// fn gets each page's rows that keep reports true for (a page with none is
// skipped). It stops at the first error.
func Walk[T any](list func(afterID int64) ([]T, error), id func(T) int64, keep func(T) bool, fn func([]T) error) error {
	var after int64
	for {
		page, err := list(after)
		if err != nil {
			return err
		}
		if len(page) == 0 {
			return nil
		}
		after = id(page[len(page)-1])
		var kept []T // not page[:0]: the listing's slice stays as it was
		for _, row := range page {
			if keep(row) {
				kept = append(kept, row)
			}
		}
		if len(kept) > 0 {
			if err := fn(kept); err != nil {
				return err
			}
		}
	}
}

// DryRun counts the rows walk yields and returns the first page of them
// (page rows; 20 when page <= 0). It changes nothing.
func DryRun[T any](walk func(fn func([]T) error) error, page int) (count int, first []T, err error) {
	if page <= 0 {
		page = 20
	}
	err = walk(func(rows []T) error {
		count += len(rows)
		if n := min(page-len(first), len(rows)); n > 0 {
			first = append(first, rows[:n]...)
		}
		return nil
	})
	return count, first, err
}

// Apply calls act with the keys of each page of rows walk yields and
// returns the sum of act's counts (so far, on an error). A key must name
// the row walk yielded and nothing else (a row id, not an event id that
// other rows share).
func Apply[T, K any](walk func(fn func([]T) error) error, key func(T) K, act func(keys ...K) (int, error)) (int, error) {
	total := 0
	err := walk(func(rows []T) error {
		keys := make([]K, len(rows))
		for i, row := range rows {
			keys[i] = key(row)
		}
		n, err := act(keys...)
		total += n
		return err
	})
	return total, err
}
