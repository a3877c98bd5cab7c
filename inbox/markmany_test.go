package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/sqlident"
)

// MarkTx records a batch's marks in one statement: a message repeated
// within a batch, or seen in an earlier batch, is reported as a duplicate,
// so each event applies once; a rolled-back batch leaves no mark; another
// consumer deduplicates on its own; a message without a usable event id
// is refused before anything is written.
func TestMarkTxAppliesEachEventOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	dedups := map[string]*inbox.Deduplicator{"batch": newDedup(t, b, "batch"), "other": newDedup(t, b, "other")}
	d := dedups["batch"]
	ctx := context.Background()
	msgs := make([]*message.Message, 300)
	for i := range msgs {
		msgs[i] = message.NewMessage(uuid.NewString(), nil)
	}
	apply := func(consumer string, batch []*message.Message, fail bool) (applied int) {
		d := dedups[consumer]
		t.Helper()
		err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			fresh, err := d.MarkTx(ctx, tx, batch...)
			if err != nil {
				return err
			}
			applied = 0
			for i, m := range batch {
				if fresh[i] {
					applied++
					if err := b.apply(ctx, tx, m.UUID, consumer); err != nil {
						return err
					}
				}
			}
			if fail {
				return errors.New("rolled back")
			}
			return nil
		})
		if err != nil && !fail {
			t.Fatal(err)
		}
		return applied
	}
	// The first 200, with every tenth twice in the batch.
	first := append([]*message.Message(nil), msgs[:200]...)
	for i := 0; i < 200; i += 10 {
		first = append(first, msgs[i])
	}
	// A rolled-back batch leaves no mark behind.
	if got := apply("batch", first, true); got != 200 {
		t.Fatalf("rolled-back batch applied %d, want 200", got)
	}
	if got := apply("batch", first, false); got != 200 {
		t.Fatalf("first batch applied %d, want 200", got)
	}
	// Then 100 seen before and 100 new.
	if got := apply("batch", msgs[100:], false); got != 100 {
		t.Fatalf("second batch applied %d, want 100", got)
	}
	if got := apply("batch", msgs, false); got != 0 {
		t.Fatalf("a redelivery of all applied %d", got)
	}
	if got := apply("other", msgs[:50], false); got != 50 {
		t.Fatalf("another consumer applied %d, want 50", got)
	}
	if e, de := b.effects(t), b.count(t, `SELECT count(DISTINCT (event_id, note)) FROM `+b.effect); e != 350 || de != 350 {
		t.Fatalf("effects %d (%d distinct), want 350", e, de)
	}

	bad := message.NewMessage("not-a-uuid", nil)
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = d.MarkTx(ctx, tx, message.NewMessage(uuid.NewString(), nil), bad)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 1 || be.Errors[0].UUID != bad.UUID ||
		!errors.Is(be.Errors[0].Err, inbox.ErrNoEventID) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("MarkTx with a bad id = %v, want a BatchError naming it", err)
	}
	// tx is untouched: it still works, and no mark was written.
	if got := b.count(t, `SELECT count(*) FROM `+b.table("processed_event")); got != 350 {
		t.Fatalf("%d marks, want 350", got)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
}

// BeginMarked records one message's mark in the round trip of BEGIN: the
// first time it opens a transaction holding the mark (rolled back, the
// mark goes with it), a duplicate opens none, and a message without a
// usable id fails as with MarkTx and leaves the connection untouched.
func TestBeginMarkedRecordsTheMarkWithBegin(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	d := newDedup(t, b, "begin-marked")
	ctx := context.Background()
	c, err := b.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	conn := c.Conn()
	msg := message.NewMessage(uuid.NewString(), nil)
	marks := func() int {
		t.Helper()
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Table(b.db.Schema, "processed_event")+` WHERE consumer = 'begin-marked'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	tx, fresh, err := d.BeginMarked(ctx, conn, msg)
	if err != nil || !fresh || tx == nil {
		t.Fatalf("first time: %v, fresh %v, tx %v; want a transaction", err, fresh, tx)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := marks(); n != 0 {
		t.Fatalf("%d marks after a rollback; want none", n)
	}
	tx, fresh, err = d.BeginMarked(ctx, conn, msg)
	if err != nil || !fresh {
		t.Fatalf("again after the rollback: %v, fresh %v", err, fresh)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := marks(); n != 1 {
		t.Fatalf("%d marks after a commit; want 1", n)
	}
	tx, fresh, err = d.BeginMarked(ctx, conn, msg)
	if err != nil || fresh || tx != nil {
		t.Fatalf("a duplicate: %v, fresh %v, tx %v; want no transaction", err, fresh, tx)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after a duplicate the connection is in transaction status %q; want idle", st)
	}

	bad := message.NewMessage("not-a-uuid", nil)
	if _, _, err := d.BeginMarked(ctx, conn, bad); !errors.Is(err, inbox.ErrNoEventID) || !core.IsPermanent(err) {
		t.Fatalf("no usable id: %v; want ErrNoEventID, permanent", err)
	}
	if st := conn.PgConn().TxStatus(); st != 'I' {
		t.Fatalf("after a refused id the connection is in transaction status %q; want idle", st)
	}
}
