package saga_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// A message on a reply topic that is not a saga reply is poisoned, logged
// at error level with its reason, its UUID and its reply topic, and
// counted in poisoned_total, by AddToRouter and by RunBatched alike. A
// reply for a saga that does not exist is not poisoned (it is recorded as
// fenced) but logged at error level too.
func TestPoisonedReplyIsLoggedAndCounted(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		name := "AddToRouter"
		if batched {
			name = "RunBatched"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var logs lockedBuffer
			logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelError})))
			metrics := prometheus.NewPedanticRegistry()
			b := setup(t, bundleOptions{metrics: metrics, logger: logger})
			def := mustDefine(t, orderSpec(b, 1))
			if err := b.o.Register(def); err != nil {
				t.Fatal(err)
			}
			topic := def.ReplyTopic()
			poisonCh, err := b.pubsub.Subscribe(context.Background(), topic+".poison")
			if err != nil {
				t.Fatal(err)
			}

			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			replies := make(chan *message.Message, 2)
			if batched {
				go func() {
					done <- b.o.RunBatched(ctx, saga.BatchConfig{
						Subscriber: listSubscriber{map[string]chan *message.Message{topic: replies}}, Poison: b.pubsub,
					})
				}()
			} else {
				if _, err := b.o.AddToRouter(b.router, saga.RouterConfig{Subscriber: b.pubsub, Poison: b.pubsub}); err != nil {
					t.Fatal(err)
				}
				go func() { done <- b.router.Run(ctx) }()
				<-b.router.Running()
			}
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			})
			send := func(msg *message.Message) {
				if batched {
					replies <- msg
				} else if err := b.pubsub.Publish(topic, msg); err != nil {
					t.Fatal(err)
				}
			}

			bad := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			bad.Metadata.Set(core.MetadataSagaID, "no-step") // not a reply: no step, attempt, operation, outcome
			send(bad)
			select {
			case p := <-poisonCh:
				p.Ack()
				if p.UUID != bad.UUID || p.Metadata.Get(middleware.PoisonedTopicKey) != topic ||
					!strings.Contains(p.Metadata.Get(middleware.ReasonForPoisonedKey), "not a saga reply") {
					t.Fatalf("poisoned %s %v, want %s from %s with its reason", p.UUID, p.Metadata, bad.UUID, topic)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the bad reply was not poisoned within 30s")
			}
			waitUntil(t, "poisoned_total = 1", func() bool {
				return counterValue(t, metrics, "millrace_saga_poisoned_total") == 1
			})
			waitUntil(t, "an error line for the poisoned reply", func() bool {
				for _, line := range strings.Split(logs.String(), "\n") {
					if strings.Contains(line, "level=ERROR") && strings.Contains(line, bad.UUID) &&
						strings.Contains(line, "not a saga reply") && strings.Contains(line, "topic="+topic) {
						return true
					}
				}
				return false
			})

			unknown := replyMsg("nobody", cmd{Step: "credit", Op: core.OperationAction, Attempt: 1}, core.OutcomeSuccess, "", "")
			send(unknown)
			waitUntil(t, "an error line for the reply of an unknown saga", func() bool {
				out := logs.String()
				return strings.Contains(out, "level=ERROR") && strings.Contains(out, "reply for an unknown saga") && strings.Contains(out, "nobody")
			})
			if n := counterValue(t, metrics, "millrace_saga_poisoned_total"); n != 1 {
				t.Fatalf("poisoned_total = %v after the unknown saga's reply, want 1 (it is fenced, not poisoned)", n)
			}
		})
	}
}

// waitUntil polls cond until it holds, or fails the test after 30s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30s", what)
		}
	}
}
