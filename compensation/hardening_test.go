package compensation_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// A command whose reply topic the participant's Writer refuses cannot be
// answered on any retry: it fails permanently (so PoisonQueue takes it,
// with the reason) before anything is written, alone and in a batch, and
// its action does not run.
func TestRefusedReplyTopicIsPermanent(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema, ValidateTopic: kafka.ValidateTopic})
	must(t, err)
	p, err := compensation.NewParticipant(b.db.Pool, compensation.Config{Schema: b.db.Schema, Name: "payments-kafka", Writer: w})
	must(t, err)
	must(t, compensation.Register(p, "reserve_credit", b.reserve, b.release))
	ctx := context.Background()

	saga := uuid.NewString()
	msg := action(saga, 1)
	msg.Metadata.Set(millrace.MetadataSagaReplyTopic, "order saga/replies")
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return p.HandleTx(ctx, tx, msg) })
	if !millrace.IsPermanent(err) || !errors.Is(err, compensation.ErrInvalidCommand) ||
		!strings.Contains(err.Error(), "order saga/replies") || !strings.Contains(err.Error(), msg.UUID) {
		t.Fatalf("HandleTx = %v, want a permanent ErrInvalidCommand naming the message and the topic", err)
	}
	good := action(uuid.NewString(), 1)
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		return p.HandleBatchTx(ctx, tx, []*message.Message{good, msg})
	})
	var be *millrace.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 1 || be.Errors[0].UUID != msg.UUID || !millrace.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("HandleBatchTx = %v, want a BatchError naming the refused command only", err)
	}
	if n := b.actionCalls.Load(); n != 0 {
		t.Fatalf("the action ran %d times for a command that cannot be answered", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier`); n != 0 {
		t.Fatalf("barrier rows = %d, want 0", n)
	}
}
