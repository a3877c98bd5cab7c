// Package dedupmark hands this module's packages a statement of the
// inbox's that its public API does not carry: the strict form of the
// dedup marks, which records the event ids of a batch and fails if any
// was recorded before. Package inbox sets Strict when it is loaded.
//
// A consumer that expects no duplicates queues the strict marks ahead of
// its first statement, in that statement's round trip, instead of reading
// the marks' answer first: a duplicate then fails the round trip with a
// unique violation (IsDuplicate), the transaction rolls back, and the
// consumer marks the batch the careful way (inbox.Deduplicator.MarkTx).
package dedupmark

import (
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
)

// Strict returns the statement and arguments that record, for dedup (an
// *inbox.Deduplicator), the event ids of msgs, failing with a unique
// violation if any was recorded before or repeats within msgs. A message
// without a usable event id fails as with MarkTx: a *core.BatchError
// naming each such message, each error wrapping inbox.ErrNoEventID.
var Strict func(dedup any, msgs []*message.Message) (sql string, args []any, err error)

// IsDuplicate reports whether err is the unique violation of a strict
// mark: an event id recorded before.
func IsDuplicate(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}
