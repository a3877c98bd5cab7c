package cli

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/poisontopic"
	"github.com/millrace/millrace/kafka"
)

// poisonRun runs the command with KAFKA_BROKERS (not --brokers) set.
func poisonRun(t *testing.T, db *pgtest.DB, brokers []string, args ...string) result {
	t.Helper()
	if db != nil {
		args = append([]string{"--database-url", pgtest.URL(), "--schema", db.Schema}, args...)
	}
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
	db := pgtest.New(t)
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

	r := poisonRun(t, db, brokers, "poison", "list", topic+".poison")
	if r.code != 0 {
		t.Fatalf("list: exit %d, %s", r.code, r.stderr)
	}
	if !strings.HasPrefix(r.stdout, "2 poisoned message(s) on "+topic+".poison") ||
		!strings.Contains(r.stdout, `participant flight`) ||
		strings.Index(r.stdout, newer.UUID) > strings.Index(r.stdout, older.UUID) {
		t.Fatalf("list:\n%s\nwant the count, newest first, the reasons", r.stdout)
	}
	r = poisonRun(t, db, brokers, "--json", "poison", "list", topic+".poison", "--brokers", strings.Join(brokers, ","))
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

	if r := poisonRun(t, db, nil, "poison", "list", topic); r.code != exitUsage || !strings.Contains(r.stderr, "KAFKA_BROKERS") {
		t.Fatalf("without brokers: %+v", r)
	}
	if r := poisonRun(t, db, brokers, "poison", "requeue", topic+".poison"); r.code != exitUsage {
		t.Fatalf("requeue without --id or --all: %+v", r)
	}
	r = poisonRun(t, db, brokers, "poison", "requeue", topic+".poison", "--id", older.UUID, "--operator", "ops", "--reason", "flight participant deployed")
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

// A bulk requeue of a poison topic through the CLI, --json parsed back:
// the dry run counts and lists the messages the flags select (reason
// match, original topic, age) and sends nothing; the requeue sends exactly
// those back.
func TestPoisonBulk(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	poisonTopic, from, other := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
	for _, tp := range []string{poisonTopic, from, other} {
		kafkatest.CreateTopic(t, brokers, tp, 1, nil)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	poisoned := func(uuid, reason, origin string) *message.Message {
		m := message.NewMessage(uuid, []byte(`{"n":1}`))
		m.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
		m.Metadata.Set(middleware.PoisonedTopicKey, origin)
		return m
	}
	unknown := poisoned("0190c3f4-0000-7000-8000-000000000011", `compensation: unknown command: "book_flight"`, from)
	bad := poisoned("0190c3f4-0000-7000-8000-000000000012", "invalid command message: bad payload", from)
	elsewhere := poisoned("0190c3f4-0000-7000-8000-000000000013", `compensation: unknown command: "refund"`, other)
	if err := pub.Publish(poisonTopic, unknown, bad, elsewhere); err != nil {
		t.Fatal(err)
	}
	okPoison := func(v any, args ...string) {
		t.Helper()
		r := poisonRun(t, db, brokers, append([]string{"--json", "poison", "requeue", poisonTopic, "--operator", "ops", "--reason", "test"}, args...)...)
		dec := json.NewDecoder(strings.NewReader(r.stdout))
		dec.DisallowUnknownFields()
		if r.code != 0 || dec.Decode(v) != nil {
			t.Fatalf("poison requeue %v: exit %d, %q %q", args, r.code, r.stdout, r.stderr)
		}
	}
	var dry deadBulkJSON
	okPoison(&dry, "--reason-match", "%unknown command%", "--dry-run")
	if !dry.DryRun || dry.Count != 2 || dry.Topic != poisonTopic || len(dry.EventIDs) != 2 {
		t.Fatalf("dry run by reason: %+v", dry)
	}
	okPoison(&dry, "--from-topic", from, "--dry-run")
	if dry.Count != 2 || !slices.Contains(dry.EventIDs, bad.UUID) || slices.Contains(dry.EventIDs, elsewhere.UUID) {
		t.Fatalf("dry run by original topic: %+v", dry)
	}
	okPoison(&dry, "--older-than", "1h", "--dry-run")
	if dry.Count != 0 || len(dry.EventIDs) != 0 {
		t.Fatalf("dry run of the messages older than an hour: %+v", dry)
	}
	if n := kafkatest.RecordCount(t, brokers, from) + kafkatest.RecordCount(t, brokers, other); n != 0 {
		t.Fatalf("the dry runs sent %d messages", n)
	}
	var done deadBulkJSON
	okPoison(&done, "--reason-match", "%unknown command%", "--from-topic", from)
	if done.DryRun || done.Count != 1 || done.Action != "requeue" || done.Refused != nil {
		t.Fatalf("requeue: %+v", done)
	}
	if n, got, err := poisontopic.Read(context.Background(), brokers, from, 0); err != nil || n != 1 || got[0].UUID != unknown.UUID {
		t.Errorf("on %s after the requeue: %d %+v %v; want only %s", from, n, got, err, unknown.UUID)
	}
	if n := kafkatest.RecordCount(t, brokers, other); n != 0 {
		t.Errorf("%d messages sent to %s, which the query left out", n, other)
	}
	r := poisonRun(t, db, brokers, "poison", "requeue", poisonTopic, "--reason-match", "%bad payload", "--operator", "ops", "--reason", "test")
	if r.code != 0 || r.stdout != "requeued 1 poisoned messages from "+poisonTopic+"\n" {
		t.Errorf("requeue, human: %+v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--id", bad.UUID, "--reason-match", "%"}, "not both"},
		{[]string{"--all", "--from-topic", from}, "not both"},
		{[]string{"--dry-run"}, "select messages with --reason-match"},
		{[]string{"--older-than", "-1h"}, "must not be negative"},
	} {
		r := poisonRun(t, db, brokers, append([]string{"poison", "requeue", poisonTopic, "--operator", "ops", "--reason", "test"}, c.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("poison requeue %v: %+v; want a usage error %q", c.args, r, c.want)
		}
	}
}
