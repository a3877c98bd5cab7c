// Package pipeline sends statements a transaction owes ahead of its next
// statement, in the same round trip.
//
// A component that must write something before it hands its transaction
// to another (the barrier's answer before the outbox Writer writes the
// reply; a saga's new state before its commands) queues those statements
// on a Tx and hands the Tx on. Whatever call comes next, the queued
// statements run first, once and in order: with an Exec, in the same round
// trip (a pgx batch); with a SendBatch, at the head of its batch; with any
// other call, in a round trip of their own first. A transaction begun with
// BeginFunc sends what is left queued at its end with its COMMIT.
package pipeline

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Statement is a statement to send in the same round trip as a later one.
type Statement struct {
	SQL  string
	Args []any
	// Read, if set, reads the statement's result from the batch (one
	// result: Exec, Query or QueryRow, as the statement needs) and returns
	// an error if it is not good: that error, as it is, fails the call
	// that sent the statement. Left nil, the result is dropped and only an
	// error of the statement counts, wrapped with its first line. Either
	// way the later statements of the round trip were sent: roll the
	// transaction back.
	Read func(pgx.BatchResults) error
}

// Tx is a pgx.Tx that sends Before ahead of its next statement.
type Tx struct {
	pgx.Tx
	Before []Statement
	// commits: a BeginFunc's, which sends Before with its COMMIT.
	commits bool
}

// read reads one queued statement's result.
func (s Statement) read(br pgx.BatchResults) error {
	if s.Read != nil {
		return s.Read(br)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("%s: %w", strings.SplitN(s.SQL, "\n", 2)[0], err)
	}
	return nil
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(t.Before) == 0 {
		return t.Tx.Exec(ctx, sql, args...)
	}
	before := t.Before
	t.Before = nil
	b := &pgx.Batch{}
	for _, s := range before {
		b.Queue(s.SQL, s.Args...)
	}
	b.Queue(sql, args...)
	br := t.Tx.SendBatch(ctx, b)
	defer br.Close()
	for _, s := range before {
		if err := s.read(br); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	tag, err := br.Exec()
	if err != nil {
		return tag, err
	}
	return tag, br.Close()
}

// Flush sends what is queued, if anything, in a round trip of its own.
func (t *Tx) Flush(ctx context.Context) error {
	if len(t.Before) == 0 {
		return nil
	}
	br := t.SendBatch(ctx, &pgx.Batch{})
	return br.Close()
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.Flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Query(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.Flush(ctx); err != nil {
		return errRow{err}
	}
	return t.Tx.QueryRow(ctx, sql, args...)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if len(t.Before) == 0 {
		return t.Tx.SendBatch(ctx, b)
	}
	before := t.Before
	t.Before = nil
	pre := make([]*pgx.QueuedQuery, 0, len(before)+len(b.QueuedQueries))
	for _, s := range before {
		pre = append(pre, &pgx.QueuedQuery{SQL: s.SQL, Arguments: s.Args})
	}
	// The queued statements' results are read here; the caller reads its
	// own.
	br := t.Tx.SendBatch(ctx, &pgx.Batch{QueuedQueries: append(pre, b.QueuedQueries...)})
	for _, s := range before {
		if err := s.read(br); err != nil {
			_ = br.Close()
			return errBatch{err: err}
		}
	}
	return br
}

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.Flush(ctx); err != nil {
		return 0, err
	}
	return t.Tx.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.Flush(ctx); err != nil {
		return nil, err
	}
	return t.Tx.Begin(ctx)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// errBatch is the results of a batch that failed before its statements
// ran (its other methods are those of a nil BatchResults).
type errBatch struct {
	pgx.BatchResults
	err error
}

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow{b.err} }
func (b errBatch) Close() error                     { return b.err }

// BeginFunc runs f in a transaction on a connection of pool, as
// pgx.BeginFunc does (rolled back if f returns an error or panics), and
// commits it in the round trip of what f left queued on the Tx: the
// statements of Before, then COMMIT, in one batch. A transaction that ends
// with its writes queued (the outbox Writer's insert, through Deferred)
// pays one round trip for them and its commit together.
//
// If a queued statement fails, nothing after it in the batch runs, COMMIT
// included, and the transaction is rolled back. A queued statement that
// succeeds cannot stop the COMMIT behind it: a check that must keep the
// transaction from committing belongs in the statement itself, as an
// error of its own, not in its Read.
func BeginFunc(ctx context.Context, pool *pgxpool.Pool, f func(*Tx) error) error {
	return BeginWith(ctx, pool, func(ctx context.Context, c *pgx.Conn) (pgx.Tx, error) { return c.Begin(ctx) }, f)
}

// BeginWith is BeginFunc with the transaction begun by begin on the
// connection: a BEGIN that carries a first statement in its round trip
// (the inbox Deduplicator's BeginMarked). A nil Tx from begin, with no
// error, says there is nothing to do: f does not run, and BeginWith
// returns nil. begin must leave the connection out of any transaction
// when it returns no Tx.
func BeginWith(ctx context.Context, pool *pgxpool.Pool, begin func(context.Context, *pgx.Conn) (pgx.Tx, error), f func(*Tx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Release destroys a connection left in a transaction, so one whose
	// rollback failed does not go back to the pool.
	defer conn.Release()
	tx, err := begin(ctx, conn.Conn())
	if err != nil || tx == nil {
		return err
	}
	t := &Tx{Tx: tx, commits: true}
	committed := false
	defer func() {
		if !committed {
			// As pgx.BeginFunc does; a failed rollback closes the
			// connection, which Release then destroys.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := f(t); err != nil {
		return err
	}
	if len(t.Before) == 0 {
		committed = true // Commit rolls back on its failure, or the connection is closed
		return tx.Commit(ctx)
	}
	before := t.Before
	t.Before = nil
	b := &pgx.Batch{}
	for _, s := range before {
		b.Queue(s.SQL, s.Args...)
	}
	b.Queue("COMMIT")
	br := tx.SendBatch(ctx, b)
	for _, s := range before {
		if err := s.read(br); err != nil {
			_ = br.Close()
			return err
		}
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	// The connection is out of the transaction now; tx, which sent no
	// COMMIT of its own, is dropped with it.
	committed = true
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Committing returns tx as the *Tx of a BeginFunc, and true, if it is one:
// its queued statements go out with its COMMIT, so a caller that would
// Flush them at its end can leave them queued.
func Committing(tx pgx.Tx) (*Tx, bool) {
	t, ok := tx.(*Tx)
	return t, ok && t.commits
}

// WriteLast sends before and then write's statement in one round trip on
// tx: write gets a pgx.Tx whose next Exec (the outbox Writer's insert)
// carries before with it. In a transaction of BeginFunc nothing is sent:
// before and write's statement stay queued and go out with the COMMIT,
// where an error of write's statement, wrapped with what, fails it. write
// may send nothing; before then goes out alone (or with the COMMIT).
func WriteLast(ctx context.Context, tx pgx.Tx, before []Statement, what string, write func(pgx.Tx) error) error {
	t, commits := Committing(tx)
	if !commits {
		t = &Tx{Tx: tx}
	}
	t.Before = append(t.Before, before...)
	if commits {
		return write(t.Deferred(what))
	}
	if err := write(t); err != nil {
		return err
	}
	return t.Flush(ctx)
}

// Deferred returns t as a pgx.Tx whose Exec queues its statement on t,
// behind Before, instead of sending it, and returns an empty command tag
// and no error: for a statement whose caller reads nothing of its result
// but its error, such as the outbox Writer's insert. The statement's
// error, wrapped with what, fails the call that sends it (with BeginFunc,
// the commit). Its other methods are t's.
func (t *Tx) Deferred(what string) pgx.Tx { return deferred{t, what} }

type deferred struct {
	*Tx
	what string
}

func (d deferred) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	what := d.what
	d.Before = append(d.Before, Statement{SQL: sql, Args: args, Read: func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}})
	return pgconn.CommandTag{}, nil
}
