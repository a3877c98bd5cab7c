// Package pgprobe checks at start that the tables a long-running part
// works on are there and usable, so that it fails loudly at once (a wrong
// schema, migrations not applied, a privilege not granted) instead of
// retrying quietly for ever.
package pgprobe

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/internal/backoff"
)

// Unusable reports whether err is PostgreSQL refusing a statement for a
// missing object or privilege, which no retry mends: SQLSTATE class 42
// (undefined table or column, insufficient privilege, ...) or 3F (invalid
// schema name), or an error of the probe's statements marked Refused.
func Unusable(err error) bool {
	var pgErr *pgconn.PgError
	var refused refusedError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "3F")) ||
		errors.As(err, &refused)
}

// Refused marks err, found by a probe's statements, as one no retry mends
// (the database is set up for something else): Probe returns it.
func Refused(err error) error { return refusedError{err} }

type refusedError struct{ err error }

func (e refusedError) Error() string { return e.err.Error() }
func (e refusedError) Unwrap() error { return e.err }

// NoPrivilege reports whether err is PostgreSQL's insufficient_privilege.
func NoPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// Beginner begins a transaction: a *pgxpool.Pool.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Probe runs statements in a transaction it rolls back, so it changes
// nothing: PostgreSQL checks that the tables exist and the privileges the
// statements need when it plans and starts them, whatever the rows, so run
// them on no rows. It returns the error of a statement that is Unusable;
// nil once they ran, or when ctx ends. Other failures (the database is not
// up yet) are passed to retrying, with the wait, and tried again after a
// backoff capped at maxWait.
func Probe(ctx context.Context, db Beginner, maxWait time.Duration, retrying func(err error, wait time.Duration), statements func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if err := statements(tx); err != nil {
				return err
			}
			return errProbeDone // roll back: the probe changes nothing
		})
		if errors.Is(err, errProbeDone) || ctx.Err() != nil {
			return nil
		}
		if Unusable(err) {
			return err
		}
		wait := backoff.Exponential(attempt, 100*time.Millisecond, maxWait)
		retrying(err, wait)
		backoff.Sleep(ctx, wait)
	}
}

var errProbeDone = errors.New("probe done")
