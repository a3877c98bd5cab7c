package compensation_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/outbox"
)

// The handler overhead of a participant over a plain dedup handler, side
// by side in one run (go test -bench . -run ^$ ./compensation/). Every
// handler writes one effect row; they run from b.RunParallel goroutines
// (GOMAXPROCS of them, times 4) like a Router's concurrent handlers:
//
//	DedupHandler             inbox dedup + one row
//	DedupHandlerWithReply    inbox dedup + one row + one reply through the outbox
//	ParticipantHandler       inbox dedup + barrier + one row + reply, a batch of one per
//	                         transaction (Handle, what AddToRouter runs)
//	ParticipantProcessor     commands stored by an inbox Receiver, applied by an
//	                         inbox Processor with HandleTx, 100 per transaction
//	ParticipantBatch         100 commands per transaction, their dedup marks in one
//	                         statement, then HandleTx

func benchEffect(ctx context.Context, tx pgx.Tx, table, sagaID string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+table+` (saga_id, step, kind, amount) VALUES ($1, 'credit', 'reserve', 40)`, sagaID)
	return err
}

func benchParticipant(b *testing.B, bb *bundle) *compensation.Participant {
	p, err := compensation.NewParticipant(bb.db.Pool, compensation.Config{Schema: bb.db.Schema, Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	err = compensation.Register(p, "reserve_credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd reserveCredit) (reserved, error) {
			return reserved{ReservationID: call.IdempotencyKey, Amount: cmd.Amount}, benchEffect(ctx, tx, bb.effect, call.SagaID)
		}, nil)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func runParallel(b *testing.B, h func(msg *message.Message) error) {
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := h(action(uuid.NewString(), 1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkDedupHandler(b *testing.B) {
	bb := setup(b, 16)
	d, err := inbox.NewDeduplicator(bb.db.Pool, inbox.DedupConfig{Schema: bb.db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		return nil, benchEffect(msg.Context(), tx, bb.effect, msg.Metadata.Get(core.MetadataSagaID))
	})
	runParallel(b, func(msg *message.Message) error { _, err := h(msg); return err })
}

func BenchmarkDedupHandlerWithReply(b *testing.B) {
	bb := setup(b, 16)
	d, err := inbox.NewDeduplicator(bb.db.Pool, inbox.DedupConfig{Schema: bb.db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	w, err := outbox.NewWriter(bb.db.Pool, outbox.WriterConfig{Schema: bb.db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	h := d.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		ctx, saga := msg.Context(), msg.Metadata.Get(core.MetadataSagaID)
		if err := benchEffect(ctx, tx, bb.effect, saga); err != nil {
			return nil, err
		}
		_, err := w.WriteTx(ctx, tx, outbox.Event{Topic: replyTopic, PartitionKey: saga, Payload: []byte(`{"amount":40}`),
			Metadata: map[string]string{core.MetadataSagaID: saga, core.MetadataSagaOutcome: core.OutcomeSuccess}})
		return nil, err
	})
	runParallel(b, func(msg *message.Message) error { _, err := h(msg); return err })
}

func BenchmarkParticipantHandler(b *testing.B) {
	bb := setup(b, 16)
	p := benchParticipant(b, bb)
	runParallel(b, p.Handle)
}

func BenchmarkParticipantProcessor(b *testing.B) {
	bb := setup(b, 16)
	p := benchParticipant(b, bb)
	ctx := context.Background()
	r, err := inbox.NewReceiver(bb.db.Pool, inbox.ReceiverConfig{Schema: bb.db.Schema, Consumer: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	proc, err := inbox.NewProcessor(bb.db.Pool, inbox.ProcessorConfig{Schema: bb.db.Schema, Consumer: "bench", Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) error { return p.HandleTx(ctx, tx, msg) }, BatchSize: 100})
	if err != nil {
		b.Fatal(err)
	}
	// Store b.N commands (not timed: the Receiver has its own benchmark in
	// package inbox), then time their application, four processors at once.
	for done := 0; done < b.N; {
		n := min(1000, b.N-done)
		msgs := make([]*message.Message, n)
		for i := range msgs {
			msgs[i] = action(uuid.NewString(), 1)
		}
		if _, err := r.Receive(ctx, msgs...); err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.ReportAllocs()
	b.ResetTimer()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				n, err := proc.ProcessOnce(ctx)
				if err != nil || n == 0 {
					errs <- err
					return
				}
			}
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := bb.count(b, `SELECT count(*) FROM `+bb.effect); got != b.N {
		b.Fatalf("effects = %d, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func BenchmarkParticipantBatch(b *testing.B) {
	bb := setup(b, 16)
	p := benchParticipant(b, bb)
	bb.p = p
	const batch = 100
	b.SetParallelism(2)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]*message.Message, 0, batch)
		flush := func() {
			if len(buf) == 0 {
				return
			}
			if err := bb.handleBatch(buf); err != nil {
				b.Error(err)
			}
			buf = buf[:0]
		}
		for pb.Next() {
			buf = append(buf, action(uuid.NewString(), 1))
			if len(buf) == batch {
				flush()
			}
		}
		flush()
	})
	b.StopTimer()
	if got := bb.count(b, `SELECT count(*) FROM `+bb.effect); got != b.N {
		b.Fatalf("effects = %d, want %d", got, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
