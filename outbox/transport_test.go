package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// The defects of issue 40 where the relay meets a transport: one bad event
// (a missing or invalid topic, a payload a transport refuses) must hold
// back its own key only, and be charged and dead-lettered, never stall the
// events of other keys and topics.

// fastRetries is a relay config that retries and dead-letters quickly.
func fastRetries(pub message.Publisher, maxAttempts int) outbox.RelayConfig {
	return outbox.RelayConfig{Publisher: pub, MaxAttempts: maxAttempts, RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond, OutageBackoffMax: 50 * time.Millisecond}
}

// writeOne writes one event and returns its id.
func writeOne(t *testing.T, w *outbox.Writer, topic, key, payload string) string {
	t.Helper()
	ids, err := w.Write(context.Background(), outbox.Event{Topic: topic, PartitionKey: key, Payload: []byte(payload)})
	if err != nil {
		t.Fatal(err)
	}
	return ids[0]
}

// eventState is where an event stands.
func eventState(t *testing.T, db *pgtest.DB, id string) (published, dead bool, attempts int, lastError string) {
	t.Helper()
	err := db.Pool.QueryRow(context.Background(), `SELECT published_at IS NOT NULL, dead_at IS NOT NULL, attempts, coalesce(last_error, '')
  FROM "`+db.Schema+`".outbox_event WHERE event_id = $1`, id).Scan(&published, &dead, &attempts, &lastError)
	if err != nil {
		t.Fatal(err)
	}
	return published, dead, attempts, lastError
}

// allPublished says whether every one of ids is marked published.
func allPublished(t *testing.T, db *pgtest.DB, ids []string) bool {
	t.Helper()
	for _, id := range ids {
		if p, _, _, _ := eventState(t, db, id); !p {
			return false
		}
	}
	return true
}

// deadLettered waits until event id is dead-lettered, and returns its
// attempts and reason.
func deadLettered(t *testing.T, db *pgtest.DB, id string) (attempts int, reason string) {
	t.Helper()
	eventually(t, time.Minute, "event "+id+" dead-lettered", func() bool {
		_, dead, _, _ := eventState(t, db, id)
		return dead
	})
	published, _, attempts, reason := eventState(t, db, id)
	if published {
		t.Fatalf("dead letter %s marked published", id)
	}
	return attempts, reason
}

// otherKeys writes one event for each of n keys, after whatever the test
// wrote before, and returns their ids.
func otherKeys(t *testing.T, w *outbox.Writer, topic string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		ids = append(ids, writeOne(t, w, topic, fmt.Sprintf("other-%d", i), fmt.Sprintf(`{"seq":%d}`, i)))
	}
	return ids
}

// A topic that does not exist (the cluster does not create topics) holds
// back its own events only: the events of an existing topic written with
// them are published at once; the missing topic's are charged, retried
// and dead-lettered after MaxAttempts. (The relay once published none of
// the existing topic's events: PublishTopics failed the whole call, and a
// batch that failed whole was taken for an outage and retried for ever.)
// Embedded broker only: the cluster here creates topics on first use.
func TestRelayMissingTopicHoldsBackOnlyItsOwnEvents(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{NoAutoCreate: true})
	db := pgtest.New(t)
	w := newWriter(t, db)
	good, missing := kafkatest.Topic(), kafkatest.Topic()
	kafkatest.CreateTopic(t, b.Addrs(), good, 3, nil)
	lost := []string{writeOne(t, w, missing, "m1", `{}`), writeOne(t, w, missing, "m2", `{}`)}
	ok := otherKeys(t, w, good, 5)
	startRelay(t, db, fastRetries(newKafkaPublisher(t, b.Addrs()), 3))
	eventually(t, 10*time.Second, "the existing topic's events published", func() bool { return allPublished(t, db, ok) })
	for _, id := range lost {
		attempts, reason := deadLettered(t, db, id)
		if attempts != 3 || !strings.Contains(reason, "does not exist") {
			t.Fatalf("event %s of the missing topic: dead after %d attempts (%s); want 3, the topic missing", id, attempts, reason)
		}
	}
}

// Events for topic names Kafka refuses (a space, 300 characters) and one
// over the topic's size, among good events: every good event is published,
// and each bad one is dead-lettered at once, with one attempt. (On the
// embedded broker the relay once published none of the good events: each
// failed with "unable to initialize a producer ID due to request failures:
// context canceled", and the oversized event was never dead-lettered.)
func TestRelayInvalidTopicsAndOversizedEventDoNotStallGoodEvents(t *testing.T) {
	t.Parallel()
	bundle := kafkaSetup(t)
	w := bundle.w
	bad := []string{
		writeOne(t, w, "bad topic", "b1", `{}`),
		writeOne(t, w, strings.Repeat("t", 300), "b2", `{}`),
		writeOne(t, w, bundle.topic, "big", `"`+strings.Repeat("x", 2<<20)+`"`),
	}
	ok := append(otherKeys(t, w, bundle.topic, 5), otherKeys(t, w, kafkatest.Topic(), 5)...)
	startRelay(t, bundle.db, fastRetries(newKafkaPublisher(t, bundle.brokers), 10))
	eventually(t, 30*time.Second, "the good events published", func() bool { return allPublished(t, bundle.db, ok) })
	for _, id := range bad {
		if attempts, reason := deadLettered(t, bundle.db, id); attempts != 1 {
			t.Fatalf("bad event %s dead after %d attempts (%s); want at once, with one", id, attempts, reason)
		}
	}
}

// A topic the producer may not write to (TOPIC_AUTHORIZATION_FAILED, as
// for an ACL missing for a while) is the topic's fault for now, not the
// events' for good: they are charged and retried, and go out once it is
// allowed; not dead-lettered at the first refusal (a brief ACL mistake
// once dead-lettered every event of the topic). Bounded: refused for
// longer than MaxAttempts allows, they are dead-lettered.
func TestRelayTopicNotAuthorizedIsRetriedThenBounded(t *testing.T) {
	t.Parallel()
	for _, brief := range []bool{true, false} {
		t.Run(map[bool]string{true: "brief", false: "lasting"}[brief], func(t *testing.T) {
			t.Parallel()
			b := kafkatest.Embedded(t, devkafka.Config{})
			var refusals atomic.Int64
			kafkatest.FailProduce(b, func(int32) int16 {
				if brief && refusals.Load() >= 2 {
					return 0
				}
				refusals.Add(1)
				return kerr.TopicAuthorizationFailed.Code
			})
			db := pgtest.New(t)
			ids := otherKeys(t, newWriter(t, db), kafkatest.Topic(), 3)
			startRelay(t, db, fastRetries(newKafkaPublisher(t, b.Addrs()), 4))
			if brief {
				eventually(t, 30*time.Second, "published once allowed", func() bool { return allPublished(t, db, ids) })
				if n := countRows(t, db, "outbox_event", "attempts > 0"); n == 0 {
					t.Fatal("no event charged for the refusals: the test did not test")
				}
				return
			}
			for _, id := range ids {
				if attempts, reason := deadLettered(t, db, id); attempts != 4 || !strings.Contains(reason, "TOPIC_AUTHORIZATION_FAILED") {
					t.Fatalf("event %s dead after %d attempts (%s); want 4, not authorized", id, attempts, reason)
				}
			}
		})
	}
}

// refuser is a plain Watermill publisher (no BatchError, a call fails
// whole at its first failure, as most adapters do) that refuses one
// message with a plain error, as NATS refuses a payload over max_payload.
type refuser struct {
	*recorder
	refuse string
}

func (p *refuser) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.UUID == p.refuse {
			return errors.New("payload refused by the server")
		}
		if err := p.recorder.Publish(topic, m); err != nil {
			return err
		}
	}
	return nil
}

// A message a plain publisher refuses, at the head of the outbox: sent
// alone while the messages after it go out, it is at fault, and charged,
// then dead-lettered after MaxAttempts; the other keys' events are
// published. (The one-at-a-time search once took the first failure for
// an outage: it charged nothing, never dead-lettered the event, logged
// "the publisher is unavailable", and published none of the others.)
func TestRelayMessageRefusedAloneIsChargedNotAnOutage(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	poison := writeOne(t, w, "t", "poison", `{}`)
	ok := otherKeys(t, w, "t", 5)
	pub := &refuser{recorder: &recorder{}, refuse: poison}
	startRelay(t, db, fastRetries(pub, 3))
	eventually(t, 10*time.Second, "the other keys' events published", func() bool { return allPublished(t, db, ok) })
	if attempts, reason := deadLettered(t, db, poison); attempts != 3 || !strings.Contains(reason, "refused") {
		t.Fatalf("the refused event: dead after %d attempts (%s); want 3", attempts, reason)
	}
}

// natsPublisher returns watermill-nats's JetStream publisher on the NATS
// server of the tests (max_payload at its default, 1 MB).
func natsPublisher(t *testing.T) message.Publisher {
	t.Helper()
	return streamtest.NATSPublisher(t, streamtest.NATSURL(t), false)
}

// An event over NATS max_payload at the head of the outbox is refused for
// good: dead-lettered at once, with NATS's reason; the other keys' events
// are published. (It was never marked permanent, never dead-lettered, and
// 0 of 5 other keys' events were published.)
func TestRelayEventOverNATSMaxPayloadIsDeadLettered(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	subject := pgtest.RandomName("millrace_test")
	poison := writeOne(t, w, subject, "poison", `"`+strings.Repeat("x", 2<<20)+`"`)
	ok := otherKeys(t, w, subject, 5)
	startRelay(t, db, fastRetries(natsPublisher(t), 10))
	eventually(t, 30*time.Second, "the other keys' events published", func() bool { return allPublished(t, db, ok) })
	if attempts, reason := deadLettered(t, db, poison); attempts != 1 || !strings.Contains(reason, "maximum payload") {
		t.Fatalf("the event over max_payload: dead after %d attempts (%s); want at once, over NATS's maximum payload", attempts, reason)
	}
}

// The same with Redis Streams and an event over proto-max-bulk-len (1 MB
// on a private server): Redis answers with a protocol error, or drops the
// connection while the payload is still being written. Either way the
// event is dead-lettered (at once for the error; after MaxAttempts for a
// reset, which looks like an outage but for the events that go out after
// it), and the other keys' events are published. (The reset counted as
// temporary, with the same stall as NATS.)
func TestRelayEventOverRedisProtoMaxBulkLenIsDeadLettered(t *testing.T) {
	t.Parallel()
	srv := streamtest.StartRedis(t)
	if err := streamtest.RedisClient(t, srv.URL).ConfigSet(context.Background(), "proto-max-bulk-len", "1048576").Err(); err != nil {
		t.Fatal(err)
	}
	db := pgtest.New(t)
	w := newWriter(t, db)
	stream := pgtest.RandomName("millrace_test")
	poisons := []string{
		writeOne(t, w, stream, "poison-1", `"`+strings.Repeat("x", 2<<20)+`"`),
		writeOne(t, w, stream, "poison-2", `"`+strings.Repeat("y", 32<<20)+`"`),
	}
	ok := otherKeys(t, w, stream, 5)
	startRelay(t, db, fastRetries(streamtest.RedisPublisher(t, srv.URL), 3))
	eventually(t, 30*time.Second, "the other keys' events published", func() bool { return allPublished(t, db, ok) })
	for _, id := range poisons {
		if attempts, reason := deadLettered(t, db, id); attempts > 3 {
			t.Fatalf("event %s over proto-max-bulk-len: dead after %d attempts (%s); want at most MaxAttempts", id, attempts, reason)
		}
	}
}

// The CDC relay, with an event over NATS max_payload in its stream among
// good events: the stream does not retry its batch for ever as an outage
// (never confirming, its slot holding WAL without bound): the event is
// dead-lettered, the others published, and the slot's position moves past
// them all.
func TestCDCRelayEventOverNATSMaxPayloadDoesNotStallTheStream(t *testing.T) {
	t.Parallel()
	b := cdcSetup(t, pgtest.New(t))
	subject := pgtest.RandomName("millrace_test")
	poison := writeOne(t, b.w, subject, "poison", `"`+strings.Repeat("x", 2<<20)+`"`)
	ok := otherKeys(t, b.w, subject, 5)
	var written string
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	cfg := fastRetries(natsPublisher(t), 10)
	cfg.Schema = b.db.Schema
	startCDCRelay(t, b.db.Pool, outbox.CDCRelayConfig{RelayConfig: cfg, StatusInterval: 100 * time.Millisecond})
	eventually(t, 30*time.Second, "the other keys' events published", func() bool { return allPublished(t, b.db, ok) })
	if attempts, reason := deadLettered(t, b.db, poison); attempts != 1 || !strings.Contains(reason, "maximum payload") {
		t.Fatalf("the event over max_payload: dead after %d attempts (%s); want at once", attempts, reason)
	}
	eventually(t, 30*time.Second, "the slot's position past every event", func() bool {
		var past bool
		err := b.db.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, outbox.DefaultSlot(b.db.Schema), written).Scan(&past)
		return err == nil && past
	})
}

// byCustomer is a kafka.Marshaler that keys records by the metadata
// "customer" (in kafka.DefaultMarshaler's format otherwise).
type byCustomer struct{}

func (byCustomer) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	r, err := kafka.DefaultMarshaler().Marshal(topic, msg)
	if r != nil {
		r.Key = []byte(msg.Metadata.Get("customer"))
	}
	return r, err
}

// Through the relay, a Marshaler that keys records by another field than
// the partition key: the relay keeps order, and holds a failed event's key
// back, by partition key, so such records would be ordered only within
// one call (a failed event of customer C let a later event of C with
// another partition key be stored past it in the next call). The
// Publisher refuses them: each is dead-lettered at once with the reason,
// and none is stored.
func TestRelayRefusesRecordsNotKeyedByThePartitionKey(t *testing.T) {
	t.Parallel()
	bundle := kafkaSetup(t)
	kafkatest.CreateTopic(t, bundle.brokers, bundle.topic, -1, map[string]string{"max.message.bytes": "100000"})
	write := func(key, payload string) string {
		ids, err := bundle.w.Write(context.Background(), outbox.Event{Topic: bundle.topic, PartitionKey: key, Payload: []byte(payload), Metadata: map[string]string{"customer": "C"}})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	ids := []string{write("order-1", `"`+strings.Repeat("x", 200_000)+`"`), write("order-2", `{}`)}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: bundle.brokers, Marshaler: byCustomer{}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	startRelay(t, bundle.db, fastRetries(pub, 10))
	for _, id := range ids {
		if attempts, reason := deadLettered(t, bundle.db, id); attempts != 1 || !strings.Contains(reason, "partition key") {
			t.Fatalf("event %s: dead after %d attempts (%s); want at once, not keyed by its partition key", id, attempts, reason)
		}
	}
	if n := kafkatest.RecordCount(t, bundle.brokers, bundle.topic); n != 0 {
		t.Fatalf("the topic holds %d records, want none", n)
	}
}
