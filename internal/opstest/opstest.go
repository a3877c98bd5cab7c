// Package opstest makes dead letters for the tests of the operator tools
// (cmd/millrace and console) the way production does: a relay whose
// publisher refuses the events, and an inbox processor whose handler fails
// permanently. Nothing is faked in SQL, so the tools are tested against the
// states the real code writes.
package opstest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// Refusal is the last error of the outbox dead letters OutboxDead makes.
const Refusal = "broker refused the message: too large"

// Refuse is a Watermill publisher that refuses every message permanently.
type Refuse struct{}

func (Refuse) Publish(string, ...*message.Message) error {
	return core.Permanent(errors.New(Refusal))
}
func (Refuse) Close() error { return nil }

// Accept is a Watermill publisher that accepts every message and counts it.
type Accept struct {
	mu sync.Mutex
	n  int
}

func (a *Accept) Publish(_ string, msgs ...*message.Message) error {
	a.mu.Lock()
	a.n += len(msgs)
	a.mu.Unlock()
	return nil
}
func (a *Accept) Close() error { return nil }

// Count returns how many messages a accepted.
func (a *Accept) Count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// Write writes n events to topic, each with a key of its own, and returns
// their ids in write order.
func Write(t testing.TB, db *pgtest.DB, topic string, n int) []string {
	t.Helper()
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{
			Topic:         topic,
			PartitionKey:  fmt.Sprintf("order-%d-%s", i, uuid.NewString()[:8]),
			AggregateType: "order",
			AggregateID:   fmt.Sprintf("order-%d", i),
			EventType:     "OrderPlaced",
			Payload:       fmt.Appendf(nil, `{"n": %d}`, i),
		}
	}
	ids, err := w.Write(context.Background(), events...)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// Relay runs a relay with pub over db's outbox until done holds for the
// outbox's stats (polled, one-minute deadline), then stops it.
func Relay(t testing.TB, db *pgtest.DB, pub message.Publisher, done func(outbox.Stats) bool) {
	t.Helper()
	relay, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{
		Schema: db.Schema, Publisher: pub, MaxAttempts: 1, PollInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = relay.Run(ctx) }()
	defer func() { cancel(); <-stopped }()
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := admin.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if done(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("opstest: relay did not reach the expected state; stats %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// OutboxDead writes n events to topic and has a relay dead-letter them all
// (its publisher refuses them with Refusal). It returns their ids.
func OutboxDead(t testing.TB, db *pgtest.DB, topic string, n int) []string {
	t.Helper()
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	before, err := admin.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := Write(t, db, topic, n)
	Relay(t, db, Refuse{}, func(s outbox.Stats) bool { return s.Dead >= before.Dead+int64(n) })
	return ids
}

// InboxFailure is the last error of the inbox dead letters InboxDead makes.
const InboxFailure = "handler: order not found"

// InboxDead stores n messages in consumer's inbox and has a processor whose
// handler fails permanently dead-letter them all. It returns their ids.
func InboxDead(t testing.TB, db *pgtest.DB, consumer string, n int) []string {
	t.Helper()
	ctx := context.Background()
	recv, err := inbox.NewReceiver(db.Pool, inbox.ReceiverConfig{Schema: db.Schema, Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*message.Message, n)
	ids := make([]string, n)
	for i := range msgs {
		ids[i] = uuid.NewString()
		msgs[i] = message.NewMessage(ids[i], fmt.Appendf(nil, `{"n": %d}`, i))
		msgs[i].Metadata.Set(core.MetadataEventID, ids[i])
	}
	if _, err := recv.Receive(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	proc, err := inbox.NewProcessor(db.Pool, inbox.ProcessorConfig{
		Schema: db.Schema, Consumer: consumer, BatchSize: n + 1,
		Handler: func(context.Context, pgx.Tx, *message.Message) error {
			return core.Permanent(errors.New(InboxFailure))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := proc.ProcessOnce(ctx); err != nil {
		t.Fatal(err)
	}
	dead, err := inbox.NewDeadLetters(db.Pool, inbox.DeadLetterConfig{Schema: db.Schema, Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	got, err := dead.List(ctx, core.ListParams{Limit: n + 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < n {
		t.Fatalf("opstest: %d inbox dead letters of %s, want at least %d", len(got), consumer, n)
	}
	return ids
}
