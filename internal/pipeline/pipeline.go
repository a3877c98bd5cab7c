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
	"errors"
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

// Query sends Before ahead of its statement, in the same round trip; the
// batch is closed with the rows.
func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if len(t.Before) == 0 {
		return t.Tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	br := t.SendBatch(ctx, b)
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow is Query's one row, as pgx's: pgx.ErrNoRows when there is none.
func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if len(t.Before) == 0 {
		return t.Tx.QueryRow(ctx, sql, args...)
	}
	rows, err := t.Query(ctx, sql, args...)
	return &batchRow{rows: rows, err: err}
}

// batchRows are the rows of a batch's last statement; closing them closes
// the batch.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br == nil {
		return
	}
	if err := r.br.Close(); err != nil && r.err == nil {
		r.err = err
	}
	r.br = nil
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r *batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
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
//
// Its BEGIN is not sent on its own either: it goes in the round trip of
// the transaction's first statement (queued ahead of Before), and a
// transaction that sends nothing sends no BEGIN.
func BeginFunc(ctx context.Context, pool *pgxpool.Pool, f func(*Tx) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// Release destroys a connection left in a transaction, so one whose
	// rollback failed does not go back to the pool.
	defer conn.Release()
	tx := &lazyTx{conn: conn.Conn()}
	t := &Tx{Tx: tx, commits: true, Before: []Statement{{SQL: beginSQL}}}
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
	if len(before) == 1 && before[0].SQL == beginSQL {
		// Nothing was sent, nothing is queued: no transaction to end.
		committed = true
		return tx.Commit(ctx)
	}
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

// beginSQL is a lazy transaction's BEGIN, queued ahead of its first
// statement.
const beginSQL = "begin"

// lazyTx is a transaction on a connection whose BEGIN the Tx that holds
// it sends ahead of its first statement (BeginFunc queues it first in
// Before): until then the connection is idle, and Commit and Rollback of a
// transaction that never began send nothing. Its statements go to the
// connection. A nested transaction (Begin) or LargeObjects, which pgx
// builds only on a transaction of its own, take one round trip more: a
// pgx transaction is made on the connection, already in the transaction,
// with a no-op for its BEGIN.
type lazyTx struct {
	conn   *pgx.Conn
	inner  pgx.Tx // made on first need by pgxTx
	closed bool
}

var _ pgx.Tx = (*lazyTx)(nil)

// inTx reports whether the connection is in a transaction block (begun,
// or failed and not yet rolled back).
func (l *lazyTx) inTx() bool { return l.conn.PgConn().TxStatus() != 'I' }

func (l *lazyTx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if l.closed {
		return nil, pgx.ErrTxClosed
	}
	if l.inner == nil {
		if !l.inTx() {
			return nil, errors.New("pipeline: the transaction's BEGIN has not been sent")
		}
		tx, err := l.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: "SELECT 1"})
		if err != nil {
			return nil, err
		}
		l.inner = tx
	}
	return l.inner, nil
}

func (l *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (l *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := l.pgxTx(context.Background())
	if err != nil {
		return pgx.LargeObjects{} // its methods fail on a nil transaction
	}
	return tx.LargeObjects()
}

func (l *lazyTx) end(ctx context.Context, sql string) (pgconn.CommandTag, error) {
	if l.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	l.closed = true
	if !l.inTx() {
		return pgconn.CommandTag{}, nil // never began
	}
	return l.conn.Exec(ctx, sql)
}

func (l *lazyTx) Commit(ctx context.Context) error {
	tag, err := l.end(ctx, "commit")
	if err != nil {
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls back; a failure leaves the connection in its transaction,
// which the pool's Release then destroys.
func (l *lazyTx) Rollback(ctx context.Context) error {
	_, err := l.end(ctx, "rollback")
	return err
}

func (l *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if l.closed {
		return 0, pgx.ErrTxClosed
	}
	return l.conn.CopyFrom(ctx, table, columns, src)
}

func (l *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if l.closed {
		return errBatch{err: pgx.ErrTxClosed}
	}
	return l.conn.SendBatch(ctx, b)
}

func (l *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if l.closed {
		return nil, pgx.ErrTxClosed
	}
	return l.conn.Prepare(ctx, name, sql)
}

func (l *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if l.closed {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return l.conn.Exec(ctx, sql, args...)
}

func (l *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if l.closed {
		return nil, pgx.ErrTxClosed
	}
	return l.conn.Query(ctx, sql, args...)
}

func (l *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if l.closed {
		return errRow{pgx.ErrTxClosed}
	}
	return l.conn.QueryRow(ctx, sql, args...)
}

func (l *lazyTx) Conn() *pgx.Conn { return l.conn }

// Conn returns the transaction's connection, having sent what is queued
// (a lazy transaction's BEGIN among it): a statement run on the connection
// itself then runs in the transaction, after them. A failure of theirs
// leaves the transaction failed, so that its commit fails.
func (t *Tx) Conn() *pgx.Conn {
	_ = t.Flush(context.Background())
	return t.Tx.Conn()
}

// LargeObjects returns the transaction's large objects, having sent what is
// queued (a lazy transaction's BEGIN among it), as Conn does.
func (t *Tx) LargeObjects() pgx.LargeObjects {
	_ = t.Flush(context.Background())
	return t.Tx.LargeObjects()
}
