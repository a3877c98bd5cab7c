package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// The poison-topic page reads the topic from Kafka: the count, the
// newest first, each with its reason; Requeue sends a message back to the
// topic it came from and says how many.
func TestPoisonPage(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var msgs []*message.Message
	for i, reason := range []string{`compensation: unknown command: "book_flight" (message "m1", participant flight)`, "bad payload"} {
		m := message.NewMessage("0190c3f4-0000-7000-8000-00000000000"+string(rune('1'+i)), []byte(`{"n":1}`))
		m.Metadata.Set("partition_key", "saga-1")
		m.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
		m.Metadata.Set(middleware.PoisonedTopicKey, topic)
		msgs = append(msgs, m)
	}
	if err := pub.Publish(topic+".poison", msgs...); err != nil {
		t.Fatal(err)
	}

	none := setup(t, console.Config{})
	r := none.get("/poison")
	contains(t, "poison page without brokers", r.body, `id="no-brokers"`, "Poison topics")

	b := setup(t, console.Config{KafkaBrokers: brokers, PoisonTopics: []string{topic + ".poison"}})
	r = b.get("/poison?topic=" + url.QueryEscape(topic+".poison"))
	if r.status != http.StatusOK {
		t.Fatalf("GET /poison: %d\n%s", r.status, r.body)
	}
	contains(t, "poison page", r.body, "<b>2</b> poisoned messages on "+topic+".poison",
		`unknown command: &#34;book_flight&#34; (message &#34;m1&#34;, participant flight)`, "bad payload", msgs[0].UUID)
	if strings.Index(r.body, msgs[1].UUID) > strings.Index(r.body, msgs[0].UUID) {
		t.Errorf("poison page: not newest first:\n%s", r.body)
	}
	token := tokenRE.FindStringSubmatch(r.body)
	if token == nil {
		t.Fatalf("no requeue form:\n%s", r.body)
	}
	r = b.post("/poison/requeue", url.Values{"reason": {"consumer fixed"}, "csrf_token": {token[1]}, "topic": {topic + ".poison"}, "id": {msgs[0].UUID}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST requeue: %d\n%s", r.status, r.body)
	}
	r = b.get(r.location[len(b.prefix):])
	contains(t, "after the requeue", r.body, "Requeued 1 poisoned message.")
	contains(t, "the log", b.logs.String(), "console: poison requeue", "operator=alice", "requeued=1")

	sub := kafkatest.NewSubscriber(t, brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ch:
		m.Ack()
		if m.UUID != msgs[0].UUID || m.Metadata.Get(middleware.ReasonForPoisonedKey) != "" {
			t.Fatalf("requeued %s %v", m.UUID, m.Metadata)
		}
	case <-ctx.Done():
		t.Fatal("the requeued message did not reach its topic")
	}
}
