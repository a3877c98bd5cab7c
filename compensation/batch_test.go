package compensation_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
)

// scripted is a sequence covering every case: a success and its retry, an
// empty compensation and its late action, an action and its compensation
// (twice), a business failure and its compensation.
func scripted() []*message.Message {
	return []*message.Message{
		action("saga-ok", 1), action("saga-ok", 2),
		compensationOf("saga-late", 1), action("saga-late", 1),
		action("saga-undo", 1), compensationOf("saga-undo", 1), compensationOf("saga-undo", 2),
		action("saga-fail", 1), compensationOf("saga-fail", 1),
	}
}

// A batch gives the same answers, effects and barrier as the same messages
// handled one at a time (batches of one), also with several messages of one
// step in a batch.
func TestBatchMatchesOneAtATime(t *testing.T) {
	t.Parallel()
	fail := func(call compensation.Call) error {
		if call.SagaID == "saga-fail" {
			return compensation.Fail("insufficient credit")
		}
		return nil
	}
	single, batched := setup(t, 4), setup(t, 4)
	single.setFailAction(fail)
	batched.setFailAction(fail)
	// A function that fails without writing anything, right after one that
	// wrote: the batch must not roll back the other's writes.
	refuse := func(context.Context, pgx.Tx, compensation.Call, struct{}) (struct{}, error) {
		return struct{}{}, compensation.Fail("refused")
	}
	must(t, compensation.Register(single.p, "refuse", refuse, nil))
	must(t, compensation.Register(batched.p, "refuse", refuse, nil))
	script := func() []*message.Message {
		r := action("saga-refused", 1)
		r.Metadata.Set(core.MetadataSagaCommand, "refuse")
		return append(scripted(), action("saga-wrote", 1), r)
	}
	for _, m := range script() {
		must(t, single.handle(m))
	}
	ctx := context.Background()
	must(t, pgx.BeginFunc(ctx, batched.db.Pool, func(tx pgx.Tx) error { return batched.p.HandleTx(ctx, tx, script()...) }))
	if n := batched.effects(t, "saga-wrote", "reserve"); n != 1 {
		t.Fatalf("saga-wrote: %d effects, want 1", n)
	}
	for _, saga := range []string{"saga-ok", "saga-late", "saga-undo", "saga-fail", "saga-wrote", "saga-refused"} {
		a, b := single.replies(t, saga), batched.replies(t, saga)
		if !slices.Equal(a, b) {
			t.Fatalf("saga %s: replies differ\nsingle:  %+v\nbatched: %+v", saga, a, b)
		}
		for _, kind := range []string{"reserve", "release"} {
			if x, y := single.effects(t, saga, kind), batched.effects(t, saga, kind); x != y {
				t.Fatalf("saga %s: %s effects single %d, batched %d", saga, kind, x, y)
			}
		}
		for _, op := range []string{core.OperationAction, core.OperationCompensation} {
			o1, e1, ok1 := single.barrier(t, saga, op)
			o2, e2, ok2 := batched.barrier(t, saga, op)
			if o1 != o2 || e1 != e2 || ok1 != ok2 {
				t.Fatalf("saga %s %s: barrier single %q/%v/%v, batched %q/%v/%v", saga, op, o1, e1, ok1, o2, e2, ok2)
			}
		}
	}
	if single.actionCalls.Load() != batched.actionCalls.Load() || single.compensateCalls.Load() != batched.compensateCalls.Load() {
		t.Fatalf("calls differ: single %d/%d, batched %d/%d", single.actionCalls.Load(), single.compensateCalls.Load(),
			batched.actionCalls.Load(), batched.compensateCalls.Load())
	}
}

// A batch with malformed messages writes nothing and names each of them.
func TestHandleTxRefusesBadMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	bad1, bad2 := action("s-1", 1), action("s-2", 1)
	bad1.Metadata.Set(core.MetadataSagaCommand, "nope")
	bad2.Payload = []byte("{")
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	err = b.p.HandleTx(ctx, tx, action("s-0", 1), bad1, bad2)
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 2 || be.Errors[0].UUID != bad1.UUID || be.Errors[1].UUID != bad2.UUID {
		t.Fatalf("err = %v, want a BatchError naming the two bad messages", err)
	}
	if !errors.Is(err, compensation.ErrUnknownCommand) || !errors.Is(err, compensation.ErrInvalidCommand) || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("err = %v: want ErrUnknownCommand and ErrInvalidCommand, permanent", err)
	}
	// tx is untouched and usable.
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("tx after a refused batch: %v", err)
	}
	must(t, tx.Commit(ctx))
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier`); n != 0 {
		t.Fatalf("barrier rows = %d, want 0", n)
	}
}

// Whatever the path, a function finds its transaction in ctx and in the
// command message's context, so the outbox's ContextPublisher writes into
// it; the message's context is restored afterwards.
func TestFunctionsFindTheTransactionInContext(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	pub := w.ContextPublisher()
	must(t, compensation.Register(b.p, "emit", func(ctx context.Context, tx pgx.Tx, call compensation.Call, _ struct{}) (struct{}, error) {
		if c, ok := core.TxFromContext(ctx); !ok || c != tx {
			return struct{}{}, errors.New("ctx does not carry the transaction")
		}
		ev := message.NewMessage(uuid.NewString(), []byte(`{}`))
		ev.Metadata.Set(core.MetadataPartitionKey, call.SagaID)
		ev.SetContext(call.Message.Context())
		return struct{}{}, pub.Publish("emitted", ev)
	}, nil))
	emit := func(saga string) *message.Message {
		m := action(saga, 1)
		m.Metadata.Set(core.MetadataSagaCommand, "emit")
		return m
	}
	ctx := context.Background()
	must(t, b.handle(emit("via-dedup")))
	bare := emit("via-handletx")
	must(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return b.p.HandleTx(ctx, tx, bare) }))
	batch := []*message.Message{emit("via-batch-1"), emit("via-batch-2")}
	must(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return b.p.HandleTx(ctx, tx, batch...) }))
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.outbox_event WHERE topic = 'emitted'`); n != 4 {
		t.Fatalf("emitted events = %d, want 4", n)
	}
	for _, m := range append(batch, bare) {
		if _, ok := core.TxFromContext(m.Context()); ok {
			t.Fatalf("message %s still carries the transaction", m.UUID)
		}
	}
}

// A batch's functions cost their own round trips and no more: the
// savepoint between two functions goes in the round trip of the next
// one's first statement. A business failure among them still rolls back
// its own writes only.
func TestHandleTxSavepointsShareRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	p, pool, trips := b.tracedParticipant(t, 1)
	const n = 10
	sagas := make([]string, n)
	batch := make([]*message.Message, n)
	for i := range batch {
		sagas[i] = uuid.NewString()
		batch[i] = action(sagas[i], 1)
	}
	failing := sagas[4]
	b.setFailAction(func(call compensation.Call) error {
		if call.SagaID == failing {
			return compensation.Fail("insufficient credit")
		}
		return nil
	})
	ctx := context.Background()
	start := trips.N()
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return p.HandleTx(ctx, tx, batch...) }))
	// BEGIN, the claims with the first savepoint, two statements per
	// function, the failed function's rollback to its savepoint, the
	// answers with the replies, COMMIT.
	if got, want := trips.N()-start, int64(1+1+2*n+1+1+1); got != want {
		t.Errorf("a batch of %d commands took %d round trips; want %d", n, got, want)
	}
	for _, id := range sagas {
		want := 1
		if id == failing {
			want = 0
		}
		if got := b.effects(t, id, "reserve"); got != want {
			t.Errorf("saga %s: %d effects, want %d", id, got, want)
		}
		if rs := b.replies(t, id); len(rs) != 1 {
			t.Errorf("saga %s: %d replies, want 1", id, len(rs))
		}
	}
}
