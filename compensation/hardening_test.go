package compensation_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
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
	msg.Metadata.Set(core.MetadataSagaReplyTopic, "order saga/replies")
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { return p.HandleTx(ctx, tx, msg) })
	if !core.IsPermanent(err) || !errors.Is(err, compensation.ErrInvalidCommand) ||
		!strings.Contains(err.Error(), "order saga/replies") || !strings.Contains(err.Error(), msg.UUID) {
		t.Fatalf("HandleTx = %v, want a permanent ErrInvalidCommand naming the message and the topic", err)
	}
	good := action(uuid.NewString(), 1)
	err = pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		return p.HandleTx(ctx, tx, good, msg)
	})
	var be *core.BatchError
	if !errors.As(err, &be) || len(be.Errors) != 1 || be.Errors[0].UUID != msg.UUID || !core.IsPermanent(be.Errors[0].Err) {
		t.Fatalf("HandleTx = %v, want a BatchError naming the refused command only", err)
	}
	if n := b.actionCalls.Load(); n != 0 {
		t.Fatalf("the action ran %d times for a command that cannot be answered", n)
	}
	if n := b.count(t, `SELECT count(*) FROM `+b.db.Schema+`.compensation_barrier`); n != 0 {
		t.Fatalf("barrier rows = %d, want 0", n)
	}
}

// A business failure has no effect, so it is not final: a later attempt of
// the step runs the action again, while the failed attempt sent again (or
// an earlier one, late) gets the stored failure. A compensation that finds
// the failure still blocks every later attempt. Alone and in batches.
func TestFailedActionRunsAgain(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "batch"}[batched], func(t *testing.T) {
			t.Parallel()
			b := setup(t, 4)
			handle := b.handle
			if batched {
				handle = func(m *message.Message) error { return b.handleBatch([]*message.Message{m}) }
			}
			var failed sync.Map
			b.setFailAction(func(call compensation.Call) error {
				if _, again := failed.LoadOrStore(call.SagaID, true); !again || strings.HasPrefix(call.SagaID, "always-") {
					return compensation.Fail("insufficient credit")
				}
				return nil
			})
			saga := uuid.NewString()
			must(t, handle(action(saga, 2)))
			must(t, handle(action(saga, 2))) // the failed attempt, sent again
			must(t, handle(action(saga, 1))) // an earlier attempt, late
			if n := b.actionCalls.Load(); n != 1 {
				t.Fatalf("action ran %d times for the failed attempt and an earlier one, want 1", n)
			}
			must(t, handle(action(saga, 3)))
			must(t, handle(action(saga, 4)))
			if n := b.actionCalls.Load(); n != 2 {
				t.Fatalf("action ran %d times, want 2 (the failure, then the later attempt)", n)
			}
			var outcomes []string
			for _, r := range b.replies(t, saga) {
				outcomes = append(outcomes, r.Attempt+":"+r.Outcome)
			}
			if got := strings.Join(outcomes, " "); got != "2:failure 2:failure 1:failure 3:success 4:success" {
				t.Fatalf("replies %s", got)
			}
			if n := b.effects(t, saga, "reserve"); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}

			// A compensation after the failure: the failure becomes
			// cancelled, and a later attempt does not run.
			saga = "always-" + uuid.NewString()
			calls := b.actionCalls.Load()
			must(t, handle(action(saga, 1)))
			must(t, handle(compensationOf(saga, 1)))
			must(t, handle(action(saga, 2)))
			if n := b.actionCalls.Load() - calls; n != 1 {
				t.Fatalf("action ran %d times, want 1 (not after its compensation)", n)
			}
			if outcome, _, _ := b.barrier(t, saga, core.OperationAction); outcome != core.OutcomeCancelled {
				t.Fatalf("action row %q after the compensation of a failure, want cancelled", outcome)
			}
			rs := b.replies(t, saga)
			if last := rs[len(rs)-1]; last.Attempt != "2" || last.Outcome != core.OutcomeCancelled {
				t.Fatalf("replies %+v, want attempt 2 cancelled", rs)
			}
		})
	}
}

// A poisoned command is logged at error level with its reason and the
// message's UUID, and counted in poisoned_total.
func TestPoisonedCommandIsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	var (
		logMu sync.Mutex
		logs  bytes.Buffer
	)
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, &slog.HandlerOptions{Level: slog.LevelError})))
	p, err := compensation.NewParticipant(b.db.Pool, compensation.Config{Schema: b.db.Schema, Name: "flight", Metrics: b.metrics, Logger: logger})
	must(t, err)
	must(t, compensation.Register(p, "book_flight", b.reserve, b.release))
	ps := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 16, Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	must(t, err)
	_, err = p.AddToRouter(router, compensation.RouterConfig{Topic: "flights", Subscriber: ps, Poison: ps})
	must(t, err)
	startRouter(t, router)
	msg := action(uuid.NewString(), 1) // reserve_credit: flight does not register it
	must(t, ps.Publish("flights", msg))
	waitFor(t, 30*time.Second, "the poisoned command's count", func() bool { return b.metric(t, "poisoned_total") == 1 })
	logMu.Lock()
	line := logs.String()
	logMu.Unlock()
	if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, msg.UUID) ||
		!strings.Contains(line, `unknown command`) || !strings.Contains(line, "participant flight") || !strings.Contains(line, "topic=flights") {
		t.Fatalf("log %q, want an error line with the reason, the message and the topic", line)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
