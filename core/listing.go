package core

import (
	"errors"
	"time"
)

// DefaultListLimit is the number of dead letters a listing returns when
// ListParams.Limit is 0.
const DefaultListLimit = 100

// ErrInvalidListParams is wrapped by a listing's error for ListParams it
// cannot serve (a negative Limit or AfterID), and by a bulk action's for a
// DeadLetterQuery whose Error pattern PostgreSQL's LIKE refuses (one that
// ends with the escape character \, or is not valid UTF-8).
var ErrInvalidListParams = errors.New("millrace: invalid list params")

// ListParams selects and pages dead letters, in the outbox
// (outbox.Admin.List) and in the inbox (inbox.DeadLetters.List).
// The zero value lists the first DefaultListLimit dead letters, oldest
// first. To page, pass the ID of the last dead letter of one page as
// AfterID of the next.
type ListParams struct {
	// Limit is the most dead letters returned. Defaults to 100
	// (DefaultListLimit); negative is an error.
	Limit int
	// AfterID returns only dead letters with a row id above it: pass the
	// last ID of one page to get the next. Defaults to 0 (from the first);
	// negative is an error.
	AfterID int64
	// Topic keeps only dead letters of this topic. Defaults to any.
	Topic string
	// PartitionKey keeps only dead letters of this key. Defaults to any.
	PartitionKey string
}

// DeadLetterQuery selects dead letters for a bulk requeue or discard, in
// the outbox (outbox.Admin.DryRun, RequeueMatching,
// DiscardMatching) and in the inbox (inbox.DeadLetters.DryRun,
// RequeueMatching, DiscardMatching). Every condition set must hold; the
// zero value selects every dead letter.
type DeadLetterQuery struct {
	// Topic and PartitionKey keep only dead letters of this topic or key
	// (matched in SQL by the listing, as ListParams). Defaults to any.
	Topic, PartitionKey string
	// EventID keeps only the dead letters with this event id: with Topic,
	// the one copy of an event written to several topics that an operator
	// chose. Defaults to any.
	EventID string
	// Error keeps only dead letters whose last error matches this SQL LIKE
	// pattern ("%timeout%": % any run of characters, _ any one, \ makes
	// the next literal; the whole error must match). A pattern ending with
	// an unescaped \ or holding invalid UTF-8 is refused, as PostgreSQL
	// refuses it. Defaults to any.
	Error string
	// DeadBefore keeps only dead letters that died before it (older than
	// an age). Defaults to any.
	DeadBefore time.Time
}

// DryRun is what a bulk action would act on: how many items its query
// selects, and the first of them (a page).
type DryRun[T any] struct {
	Count int
	First []T
}
