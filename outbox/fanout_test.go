package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// fanOut writes one event to each of topics (a fan-out: one id, a copy per
// topic), in that order, and returns its id.
func fanOut(t *testing.T, w *outbox.Writer, payload string, topics ...string) string {
	t.Helper()
	id := uuid.NewString()
	var events []outbox.Event
	for _, topic := range topics {
		events = append(events, outbox.Event{ID: id, Topic: topic, PartitionKey: "k", Payload: []byte(payload)})
	}
	if _, err := w.Write(context.Background(), events...); err != nil {
		t.Fatal(err)
	}
	return id
}

// copyState is where the copy of event id on topic stands.
func copyState(t *testing.T, db *pgtest.DB, id, topic string) (published, dead bool, lastError string) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL, dead_at IS NOT NULL, coalesce(last_error, '')
  FROM "`+db.Schema+`".outbox_event WHERE event_id = $1 AND topic = $2`, id, topic).Scan(&published, &dead, &lastError)
	if err != nil {
		t.Fatal(err)
	}
	return published, dead, lastError
}

// An event written to two topics whose first copy fails for a while, in a
// PublishTopics call with the second: the failed copy is the one retried,
// and goes out; the delivered copy is marked published and not sent again.
// (The relay once matched the failure by event id alone, retried the
// delivered copy, a duplicate, and marked the failed one published: that
// topic never got the event.)
func TestRelayFanOutRetriesTheCopyThatFailed(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	id := fanOut(t, newWriter(t, db), `{}`, "first", "second")
	var failures atomic.Int64
	rec := &topicsRecorder{recorder: &recorder{batchErrors: true}}
	rec.setFail(func(m *message.Message) error {
		if m.UUID == id && m.Metadata.Get("failing") == "" && failures.Add(1) <= 2 {
			return busyError{}
		}
		return nil
	})
	// The recorder learns a message's topic only when it stores it: the
	// copy on "first" is told apart by a mark the test sets before.
	pub := &markSecond{topicsRecorder: rec}
	startRelay(t, db, outbox.RelayConfig{Publisher: pub, Workers: 1, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "both copies published", func() bool {
		p1, _, _ := copyState(t, db, id, "first")
		p2, _, _ := copyState(t, db, id, "second")
		return p1 && p2
	})
	got := map[string]int{}
	for _, m := range rec.snapshot() {
		got[m.Metadata.Get("topic")]++
	}
	if got["first"] != 1 || got["second"] != 1 {
		t.Fatalf("deliveries by topic %v; want the event once on each of first and second", got)
	}
	if failures.Load() < 2 {
		t.Fatal("the failure did not bite")
	}
}

// markSecond marks the messages of topic "second" before its recorder sees
// them, so the recorder's failure rule can fail only the copy on "first".
type markSecond struct{ *topicsRecorder }

func (p *markSecond) PublishTopics(byTopic map[string][]*message.Message) error {
	for _, m := range byTopic["second"] {
		m.Metadata.Set("failing", "no")
	}
	return p.topicsRecorder.PublishTopics(byTopic)
}

// The same through kafka.Publisher, with each relay: an event written to a
// topic that takes less than its size and to one that takes it. The copy
// on the first is dead-lettered, as too large; the copy on the second is
// published once and marked so.
func TestFanOutCopyRefusedByItsTopicIsTheOneDeadLettered(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"polling", "cdc"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			bundle := kafkaSetup(t)
			small, large := kafkatest.Topic(), kafkatest.Topic()
			kafkatest.CreateTopic(t, bundle.brokers, small, -1, map[string]string{"max.message.bytes": "2000"})
			kafkatest.CreateTopic(t, bundle.brokers, large, -1, nil)
			w := bundle.w
			cfg := outbox.RelayConfig{Schema: bundle.db.Schema, Publisher: newKafkaPublisher(t, bundle.brokers), RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond}
			if mode == "cdc" {
				w = cdcSetup(t, bundle.db).w
			}
			payload := `{"seq":1,"blob":"` + strings.Repeat("x", 5000) + `"}`
			id := fanOut(t, w, payload, small, large)
			if mode == "cdc" {
				startCDCRelay(t, bundle.db.Pool, outbox.CDCRelayConfig{RelayConfig: cfg})
			} else {
				startRelay(t, bundle.db, cfg)
			}
			c := consume(t, bundle.brokers, large)
			eventually(t, time.Minute, "the copy on the small topic dead-lettered", func() bool {
				_, dead, _ := copyState(t, bundle.db, id, small)
				return dead
			})
			published, dead, reason := copyState(t, bundle.db, id, small)
			if published || !strings.Contains(reason, "too large") {
				t.Fatalf("the copy on the small topic: published %v, dead %v, reason %q; want dead as too large, not published", published, dead, reason)
			}
			eventually(t, time.Minute, "the copy on the large topic consumed", func() bool { return c.count(id) > 0 })
			if published, dead, reason := copyState(t, bundle.db, id, large); !published || dead {
				t.Fatalf("the copy on the large topic: published %v, dead %v (%s); want published", published, dead, reason)
			}
			if n := countRows(t, bundle.db, "outbox_pending", ""); n != 1 {
				t.Fatalf("%d events pending, want the one dead letter", n)
			}
			if n := c.count(id); n != 1 {
				t.Fatalf("the large topic got the event %d times, want once", n)
			}
		})
	}
}

// A copy dead-lettered in a batch of its own (a stream batch or a claim
// that split the event's copies) does not hold back its event's copy on
// another topic, claimed after it: that copy is published. A later event
// of the key still waits behind the dead letter, in every topic. (The copy
// once waited behind its sibling's dead letter for good: a CDC batch that
// split the copies left it pending.)
func TestFanOutCopyIsNotHeldBehindItsSiblingsDeadLetter(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	id := fanOut(t, w, `{}`, "small", "large")
	later := fanOut(t, w, `{}`, "large")
	var first atomic.Bool
	rec := &recorder{batchErrors: true}
	rec.setFail(func(m *message.Message) error {
		// BatchSize 1 claims in id order: the first call is the copy on
		// "small", refused for good.
		if m.UUID == id && first.CompareAndSwap(false, true) {
			return core.Permanent(errors.New("message too large"))
		}
		return nil
	})
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, BatchSize: 1, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "the copy on large published", func() bool {
		published, _, _ := copyState(t, db, id, "large")
		return published
	})
	if published, dead, _ := copyState(t, db, id, "small"); published || !dead {
		t.Fatalf("the copy on small: published %v, dead %v; want dead", published, dead)
	}
	time.Sleep(300 * time.Millisecond) // thirty polls
	if published, _, _ := copyState(t, db, later, "large"); published {
		t.Fatal("a later event of the key went out past the dead letter")
	}
	if got := rec.ids(); got[id] != 1 || got[later] != 0 {
		t.Fatalf("deliveries %v; want the event once (on large) and the later event not at all", got)
	}
}
