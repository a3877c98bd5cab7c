package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// poisonRun runs the command with KAFKA_BROKERS (not --brokers) set.
func poisonRun(t *testing.T, brokers []string, args ...string) result {
	t.Helper()
	var stdout, stderr strings.Builder
	env := func(k string) string {
		if k == "KAFKA_BROKERS" {
			return strings.Join(brokers, ",")
		}
		return ""
	}
	code := run(context.Background(), args, &stdout, &stderr, env)
	return result{stdout.String(), stderr.String(), code}
}

// The poison commands read a poison topic from Kafka (count, newest first,
// the reason) and requeue its messages to the topic they came from, with
// their payload and original metadata.
func TestPoisonListAndRequeue(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	// As PoisonQueue writes them: the reason and the original topic in
	// metadata, beside the message's own.
	poisoned := func(uuid, payload, reason string) *message.Message {
		m := message.NewMessage(uuid, []byte(payload))
		m.Metadata.Set("saga_command", "book_flight")
		m.Metadata.Set("partition_key", "saga-1") // one partition: offsets order the messages when timestamps tie
		m.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
		m.Metadata.Set(middleware.PoisonedTopicKey, topic)
		m.Metadata.Set(middleware.PoisonedHandlerKey, "flight."+topic)
		return m
	}
	older := poisoned("0190c3f4-0000-7000-8000-000000000001", `{"n":1}`, `compensation: unknown command: "book_flight" (message "x", participant flight)`)
	if err := pub.Publish(topic+".poison", older); err != nil {
		t.Fatal(err)
	}
	newer := poisoned("0190c3f4-0000-7000-8000-000000000002", `{"n":2}`, "compensation: invalid command message: bad payload")
	if err := pub.Publish(topic+".poison", newer); err != nil {
		t.Fatal(err)
	}

	r := poisonRun(t, brokers, "poison", "list", topic+".poison")
	if r.code != 0 {
		t.Fatalf("list: exit %d, %s", r.code, r.stderr)
	}
	if !strings.HasPrefix(r.stdout, "2 poisoned message(s) on "+topic+".poison") ||
		!strings.Contains(r.stdout, `participant flight`) ||
		strings.Index(r.stdout, newer.UUID) > strings.Index(r.stdout, older.UUID) {
		t.Fatalf("list:\n%s\nwant the count, newest first, the reasons", r.stdout)
	}
	r = poisonRun(t, brokers, "--json", "poison", "list", topic+".poison", "--brokers", strings.Join(brokers, ","))
	var got struct {
		Total    int `json:"total"`
		Messages []struct {
			UUID, Reason, Topic string
			Metadata            map[string]string
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Total != 2 || len(got.Messages) != 2 ||
		got.Messages[0].UUID != newer.UUID || got.Messages[1].Topic != topic || got.Messages[1].Metadata["saga_command"] != "book_flight" {
		t.Fatalf("list --json: %v %s", err, r.stdout)
	}

	if r := poisonRun(t, nil, "poison", "list", topic); r.code != exitUsage || !strings.Contains(r.stderr, "KAFKA_BROKERS") {
		t.Fatalf("without brokers: %+v", r)
	}
	if r := poisonRun(t, brokers, "poison", "requeue", topic+".poison"); r.code != exitUsage {
		t.Fatalf("requeue without --id or --all: %+v", r)
	}
	r = poisonRun(t, brokers, "poison", "requeue", topic+".poison", "--id", older.UUID)
	if r.code != 0 || r.stdout != "requeued 1 message(s) from "+topic+".poison\n" {
		t.Fatalf("requeue: %+v", r)
	}
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
		if m.UUID != older.UUID || string(m.Payload) != `{"n":1}` || m.Metadata.Get("saga_command") != "book_flight" ||
			m.Metadata.Get(middleware.ReasonForPoisonedKey) != "" {
			t.Fatalf("requeued %s %s %v", m.UUID, m.Payload, m.Metadata)
		}
	case <-ctx.Done():
		t.Fatal("the requeued message did not reach its topic")
	}
}
