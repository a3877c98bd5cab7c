package poisontopic_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/poisontopic"
	"github.com/millrace/millrace/kafka"
)

// Poisoned messages in bulk: the dry run counts and lists the messages a
// query selects (reason match, original topic, age) and sends nothing;
// RequeueMatching sends exactly those back to their topics, refusing (and
// counting) one that does not say where it came from.
func TestRequeueMatching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	topic, from, other := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
	for _, tp := range []string{topic, from, other} {
		kafkatest.CreateTopic(t, brokers, tp, 1, nil)
	}
	poisoned := func(id, reason, origin string) *message.Message {
		m := message.NewMessage(id, []byte(`{"id":"`+id+`"}`))
		m.Metadata.Set("saga_command", "x")
		m.Metadata.Set(middleware.ReasonForPoisonedKey, reason)
		if origin != "" {
			m.Metadata.Set(middleware.PoisonedTopicKey, origin)
		}
		return m
	}
	unknown := poisoned("0190c3f4-0000-7000-8000-000000000001", `compensation: unknown command: "book_flight"`, from)
	bad := poisoned("0190c3f4-0000-7000-8000-000000000002", "invalid command message: bad payload", from)
	old := poisoned("0190c3f4-0000-7000-8000-000000000003", `compensation: unknown command: "refund"`, other)
	lost := poisoned("0190c3f4-0000-7000-8000-000000000004", "compensation: unknown command: lost", "")
	now := time.Now()
	produce(t, brokers, topic, now, unknown, bad)
	produce(t, brokers, topic, now.Add(-time.Hour), old)
	produce(t, brokers, topic, now, lost)

	halfHourAgo := now.Add(-30 * time.Minute)
	for _, c := range []struct {
		q    poisontopic.Query
		want []string // newest first
	}{
		{poisontopic.Query{}, []string{lost.UUID, bad.UUID, unknown.UUID, old.UUID}},
		{poisontopic.Query{Reason: "%unknown command%"}, []string{lost.UUID, unknown.UUID, old.UUID}},
		{poisontopic.Query{Reason: "unknown command%"}, nil}, // the whole reason must match
		{poisontopic.Query{FromTopic: from}, []string{bad.UUID, unknown.UUID}},
		{poisontopic.Query{PoisonedBefore: halfHourAgo}, []string{old.UUID}},
		{poisontopic.Query{Reason: `%"refund"`, FromTopic: other}, []string{old.UUID}},
		{poisontopic.Query{Reason: `%"refund"`, FromTopic: from}, nil},
	} {
		d, err := poisontopic.DryRunMatching(ctx, brokers, topic, c.q, 2)
		if err != nil {
			t.Fatal(err)
		}
		var first []string
		for _, m := range d.First {
			first = append(first, m.UUID)
		}
		if d.Count != len(c.want) || !slices.Equal(first, c.want[:min(2, len(c.want))]) {
			t.Errorf("dry run %+v: %d, first %v; want %d, first %v", c.q, d.Count, first, len(c.want), c.want[:min(2, len(c.want))])
		}
	}
	if n := kafkatest.RecordCount(t, brokers, from) + kafkatest.RecordCount(t, brokers, other); n != 0 {
		t.Fatalf("the dry runs sent %d messages", n)
	}

	out, err := poisontopic.RequeueMatching(ctx, brokers, topic, poisontopic.Query{Reason: "%unknown command%"})
	if err != nil {
		t.Fatal(err)
	}
	if out.Matched != 3 || out.Requeued != 2 || len(out.Refused) != 1 || out.Refused[poisontopic.RefusedNoTopic] != 1 {
		t.Fatalf("requeue matching: %+v; want 3 matched, 2 requeued, 1 refused: %s", out, poisontopic.RefusedNoTopic)
	}
	for tp, want := range map[string]*message.Message{from: unknown, other: old} {
		n, got, err := poisontopic.Read(ctx, brokers, tp, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n != 1 || got[0].UUID != want.UUID || got[0].Payload != string(want.Payload) || got[0].Metadata["saga_command"] != "x" || got[0].Reason != "" {
			t.Errorf("on %s after the requeue: %d, %+v; want only %s, as it was", tp, n, got, want.UUID)
		}
	}
	if n, _, err := poisontopic.Read(ctx, brokers, topic, 0); err != nil || n != 4 {
		t.Errorf("the poison topic after the requeue: %d, %v; Kafka keeps all 4", n, err)
	}
}

// produce writes msgs to topic as a Watermill publisher would, with the
// record timestamp at.
func produce(t *testing.T, brokers []string, topic string, at time.Time, msgs ...*message.Message) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for _, m := range msgs {
		r, err := kafka.DefaultMarshaler().Marshal(topic, m)
		if err != nil {
			t.Fatal(err)
		}
		r.Topic, r.Timestamp = topic, at
		recs = append(recs, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
