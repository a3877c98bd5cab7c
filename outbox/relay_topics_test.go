package outbox_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// topicsRecorder is a recorder that is also an outbox.TopicsPublisher.
type topicsRecorder struct {
	*recorder
	topicsCalls atomic.Int64
	firstTopics atomic.Int64 // the topics of the first PublishTopics call
	failWhole   atomic.Int64 // so many calls fail whole, with no BatchError
}

func (r *topicsRecorder) PublishTopics(byTopic map[string][]*message.Message) error {
	if r.topicsCalls.Add(1) == 1 {
		r.firstTopics.Store(int64(len(byTopic)))
	}
	if r.failWhole.Add(-1) >= 0 {
		return errors.New("connection lost")
	}
	var be core.BatchError
	for topic, msgs := range byTopic {
		err := r.publish(topic, msgs)
		var e *core.BatchError
		if errors.As(err, &e) {
			for _, me := range e.Errors {
				me.Topic = topic // as kafka.Publisher names a failed copy
				be.Errors = append(be.Errors, me)
			}
		} else if err != nil {
			return err
		}
	}
	if len(be.Errors) > 0 {
		return &be
	}
	return nil
}

// writeTopics writes n events to each of topics, before the relay starts,
// and returns their ids by topic.
func writeTopics(t *testing.T, db *pgtest.DB, topics []string, n int) map[string][]string {
	t.Helper()
	w := newWriter(t, db)
	ids := map[string][]string{}
	for _, topic := range topics {
		ids[topic] = writeN(t, w, topic, n, 5)
	}
	return ids
}

// checkDelivered fails t unless every id was delivered once and each
// topic's keys kept the order of their ids.
func checkDelivered(t *testing.T, rec *recorder, ids map[string][]string) {
	t.Helper()
	got := rec.ids()
	pos := map[string]int{}
	for _, topicIDs := range ids {
		for i, id := range topicIDs {
			if got[id] != 1 {
				t.Fatalf("event %s delivered %d times, want once", id, got[id])
			}
			pos[id] = i
		}
	}
	last := map[string]int{}
	for _, m := range rec.snapshot() {
		k := m.Metadata.Get("topic") + "/" + m.Metadata.Get(core.MetadataPartitionKey)
		if p, ok := last[k]; ok && pos[m.UUID] < p {
			t.Fatalf("%s: event %s delivered after a later one of its key", k, m.UUID)
		}
		last[k] = pos[m.UUID]
	}
}

// A batch that holds several topics goes to a TopicsPublisher in one
// call, not in a Publish call per topic. What the call's BatchError names
// (here a temporary failure) returns to the pending set and goes out
// later, in its key's order; the same key in the other topics is not held
// back in the batch (order is per topic and key), and that is no breach
// of order to log.
func TestRelaySendsSeveralTopicsInOneCall(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	topics := []string{"orders", "payments", "shipments"}
	ids := writeTopics(t, db, topics, 30)
	failOnce := ids["payments"][3]
	var failed atomic.Bool
	rec := &topicsRecorder{recorder: &recorder{batchErrors: true}}
	rec.setFail(func(m *message.Message) error {
		if m.UUID == failOnce && failed.CompareAndSwap(false, true) {
			return busyError{}
		}
		return nil
	})
	logs := watermill.NewCaptureLogger()
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, Workers: 1, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond, Logger: logs})
	eventually(t, 30*time.Second, "every event published", func() bool { return len(rec.ids()) == 90 })
	checkDelivered(t, rec.recorder, ids)
	if n := rec.firstTopics.Load(); n != 3 {
		t.Fatalf("the first call held %d topics, want the batch's 3", n)
	}
	if !failed.Load() {
		t.Fatal("the failure did not bite")
	}
	for _, m := range logs.Captured()[watermill.ErrorLogLevel] {
		t.Errorf("logged: %s %v", m.Msg, m.Fields)
	}
}

// A PublishTopics call that fails whole (no BatchError) is sent again a
// topic at a time, as to a publisher without PublishTopics: here each
// topic's call goes through, and nothing is delivered twice.
func TestRelayTopicsCallFailedWholeGoesTopicByTopic(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	topics := []string{"orders", "payments", "shipments"}
	ids := writeTopics(t, db, topics, 30)
	rec := &topicsRecorder{recorder: &recorder{batchErrors: true}}
	rec.failWhole.Store(1)
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, Workers: 1, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "every event published", func() bool { return len(rec.ids()) == 90 })
	checkDelivered(t, rec.recorder, ids)
	if n := rec.calls.Load(); n != 3 {
		t.Fatalf("%d Publish calls after the failed PublishTopics, want one per topic (3)", n)
	}
	if n := countRows(t, db, "outbox_event", "attempts > 0 OR last_error IS NOT NULL"); n != 0 {
		t.Fatalf("%d events charged or marked failed", n)
	}
}
