package inbox_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

// In a Router, a message the Receiver refuses (NUL in a header, or a
// subscribe topic with NUL) is not retried and goes to the PoisonQueue
// with the reason; the subscription goes on with the next message.
func TestReceiverRefusalGoesToPoisonQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	r := newReceiver(t, b, "c")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logger := watermill.NopLogger{}
	pubsub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	defer pubsub.Close()
	poisoned, err := pubsub.Subscribe(ctx, "poison")
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	poison, err := middleware.PoisonQueue(pubsub, "poison")
	if err != nil {
		t.Fatal(err)
	}
	retry := middleware.Retry{MaxRetries: 5, InitialInterval: time.Millisecond, ShouldRetry: inbox.ShouldRetry}
	router.AddMiddleware(poison, retry.Middleware)
	var calls atomic.Int32
	handle := func(m *message.Message) error {
		calls.Add(1)
		return r.Handle(m)
	}
	const badTopic = "orders\x00eu"
	router.AddConsumerHandler("orders", "orders", pubsub, handle)
	router.AddConsumerHandler("bad-topic", badTopic, pubsub, handle)
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	defer func() {
		if err := router.Close(); err != nil {
			t.Error(err)
		}
		<-done
	}()
	<-router.Running()

	nulHeader := message.NewMessage(uuid.NewString(), []byte(`{}`))
	nulHeader.Metadata.Set("traceparent", "00-\x00")
	good := message.NewMessage(uuid.NewString(), []byte(`{}`))
	good.Metadata.Set(core.MetadataPartitionKey, "k")
	onBadTopic := message.NewMessage(uuid.NewString(), []byte(`{}`))
	if err := pubsub.Publish("orders", nulHeader, good); err != nil {
		t.Fatal(err)
	}
	if err := pubsub.Publish(badTopic, onBadTopic); err != nil {
		t.Fatal(err)
	}
	reasons := map[string]string{}
	for len(reasons) < 2 {
		select {
		case m := <-poisoned:
			reasons[m.UUID] = m.Metadata.Get(middleware.ReasonForPoisonedKey)
			m.Ack()
		case <-time.After(30 * time.Second):
			t.Fatalf("poisoned %d of 2 messages", len(reasons))
		}
	}
	for id, want := range map[string]string{nulHeader.UUID: `metadata "traceparent" value`, onBadTopic.UUID: "topic"} {
		if !strings.Contains(reasons[id], inbox.ErrUnstorable.Error()) || !strings.Contains(reasons[id], want) {
			t.Errorf("message %s poisoned with reason %q; want ErrUnstorable naming the %s", id, reasons[id], want)
		}
	}
	waitFor(t, 10*time.Second, "the good message to be stored", func() bool {
		return b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE event_id = $1 AND topic = 'orders'`, good.UUID) == 1
	})
	if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")); got != 1 {
		t.Fatalf("%d rows stored, want only the good message", got)
	}
	if got := calls.Load(); got != 3 {
		t.Fatalf("the handler ran %d times for 3 messages; refusals must not be retried", got)
	}
}
