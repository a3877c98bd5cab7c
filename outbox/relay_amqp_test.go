package outbox_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// The relay publishes to any Watermill publisher: here RabbitMQ through
// watermill-amqp, unchanged. RabbitMQ runs on the development machines
// (AMQP_URL, default amqp://guest:guest@127.0.0.1:5672/); where none
// answers the test is skipped, saying so, since Kafka is millrace's
// transport and RabbitMQ an option.
func TestRelayPublishesToRabbitMQ(t *testing.T) {
	t.Parallel()
	uri := os.Getenv("AMQP_URL")
	if uri == "" {
		uri = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:5672", time.Second); err != nil && os.Getenv("AMQP_URL") == "" {
		t.Skipf("no RabbitMQ at 127.0.0.1:5672 (%v); set AMQP_URL to run this test", err)
	} else if c != nil {
		c.Close()
	}
	cfg := amqp.NewDurableQueueConfig(uri)
	pub, err := amqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sub, err := amqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })

	db := pgtest.New(t)
	w := newWriter(t, db)
	queue := pgtest.RandomName("millrace_test")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	msgs, err := sub.Subscribe(ctx, queue) // declares the queue before anything is published
	if err != nil {
		t.Fatal(err)
	}
	ids := writeN(t, w, queue, 200, 5)
	startRelay(t, db, outbox.RelayConfig{Publisher: pub})

	got := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for len(got) < len(ids) {
		select {
		case m := <-msgs:
			got[m.UUID] = true
			m.Ack()
		case <-deadline:
			t.Fatalf("%d of %d events arrived through RabbitMQ", len(got), len(ids))
		}
	}
	for _, id := range ids {
		if !got[id] {
			t.Fatalf("event %s missing", id)
		}
	}
	eventually(t, 10*time.Second, "all marked published", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
}
