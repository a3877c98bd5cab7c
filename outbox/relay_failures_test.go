package outbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// busyError is a temporary failure, as kafka.Publisher reports an outage.
type busyError struct{}

func (busyError) Error() string   { return "broker busy" }
func (busyError) Temporary() bool { return true }

// Temporary failures of part of a batch charge no attempt, however often
// they happen (MaxAttempts is 2; each failing event fails three times),
// and dead-letter nothing; a permanent failure dead-letters its event at
// once, with its reason, while everything else flows.
func TestRelayTemporaryFailuresChargeNothingPermanentDiesAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	poison, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "poison", Payload: []byte(`{"poison":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	ids := writeN(t, w, "t", 400, 40)

	var mu sync.Mutex
	tries := map[string]int{}
	rec := &recorder{batchErrors: true}
	rec.setFail(func(m *message.Message) error {
		if m.UUID == poison[0] {
			return core.Permanent(errors.New("message too large"))
		}
		key := m.Metadata.Get(core.MetadataPartitionKey)
		if !strings.HasSuffix(key, "7") { // key-7, key-17, ...: a quarter of the events
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if tries[m.UUID]++; tries[m.UUID] <= 3 {
			return busyError{}
		}
		return nil
	})
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, MaxAttempts: 2, RetryMin: time.Millisecond, RetryMax: 5 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "all but the poison published", func() bool {
		got := rec.ids()
		for _, id := range ids {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	eventually(t, 10*time.Second, "poison dead-lettered", func() bool {
		return countRows(t, db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%too large%'") == 1
	})
	if n := countRows(t, db, "outbox_event", "last_error LIKE '%broker busy%'"); n == 0 {
		t.Fatal("no event recorded a temporary failure: the test did not test")
	}
	if n := countRows(t, db, "outbox_event", "attempts > 0 AND last_error NOT LIKE '%too large%'"); n != 0 {
		t.Fatalf("%d events charged attempts for temporary failures", n)
	}
	if n := countRows(t, db, "outbox_event", "dead_at IS NOT NULL"); n != 1 {
		t.Fatalf("%d dead letters, want only the poison", n)
	}
	if got := rec.ids(); got[poison[0]] != 0 {
		t.Fatal("poison published")
	}
}

// wholeFailer is a plain Watermill publisher (no BatchError) that fails
// every call while down, counting calls with one message and with more.
type wholeFailer struct {
	down           atomic.Bool
	whole, singles atomic.Int64
	err            func(*message.Message) error
}

func (p *wholeFailer) Publish(_ string, msgs ...*message.Message) error {
	if len(msgs) == 1 {
		p.singles.Add(1)
		if p.err != nil {
			if err := p.err(msgs[0]); err != nil {
				return err
			}
		}
	} else {
		p.whole.Add(1)
	}
	if p.down.Load() {
		return errors.New("connection lost")
	}
	return nil
}

func (p *wholeFailer) Close() error { return nil }

// A publisher that fails whole calls during an outage costs one call for
// the batch and a few for its first messages, not one per key: the one-at-
// a-time search stops after three failures in a row that are not permanent
// and the batch is an outage (nothing charged). Once it is back,
// everything goes.
func TestRelayFallbackStopsAtFirstNonPermanentFailure(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	ids := writeN(t, w, "t", 200, 50)
	pub := &wholeFailer{}
	pub.down.Store(true)
	// One worker over all lanes: each try is one batch of all 200 events.
	startRelay(t, db, outbox.RelayConfig{Publisher: pub, Workers: 1, LanesPerBatch: outbox.Lanes, OutageBackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "five tries of the batch", func() bool { return pub.whole.Load() >= 5 })
	whole, singles := pub.whole.Load(), pub.singles.Load()
	if singles > 3*whole {
		t.Fatalf("%d whole calls and %d one-message calls: the fallback went past three failures in a row", whole, singles)
	}
	if n := countRows(t, db, "outbox_event", "attempts > 0"); n != 0 {
		t.Fatalf("%d events charged during the outage", n)
	}
	pub.down.Store(false)
	eventually(t, 30*time.Second, "all published after the outage", func() bool {
		return countRows(t, db, "outbox_event", "published_at IS NOT NULL") == len(ids)
	})
}

// The fallback still finds a message at fault that fails for good: it is
// dead-lettered at once; three non-permanent failures in a row after it
// end the search, and the events not tried wait, uncharged.
func TestRelayFallbackDeadLettersPermanentThenStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	poison, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "poison", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	writeN(t, w, "t", 50, 10)
	pub := &wholeFailer{err: func(m *message.Message) error {
		if m.UUID == poison[0] {
			return core.Permanent(errors.New("rejected for good"))
		}
		return nil
	}}
	pub.down.Store(true)
	startRelay(t, db, outbox.RelayConfig{Publisher: pub, Workers: 1, LanesPerBatch: outbox.Lanes, OutageBackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	eventually(t, 30*time.Second, "poison dead-lettered", func() bool {
		return countRows(t, db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%rejected for good%'") == 1
	})
	eventually(t, 30*time.Second, "two more tries of the batch", func() bool { return pub.whole.Load() >= 3 })
	if n := countRows(t, db, "outbox_event", "attempts > 0"); n != 1 {
		t.Fatalf("%d events charged, want only the poison", n)
	}
	if whole, singles := pub.whole.Load(), pub.singles.Load(); singles > 4*whole {
		t.Fatalf("%d whole calls and %d one-message calls: the fallback went past three failures in a row", whole, singles)
	}
}

// liar publishes nothing and returns a BatchError naming one message the
// call did not hold (and, if named is set, one it did).
type liar struct {
	calls atomic.Int64
	named bool
}

func (l *liar) Publish(_ string, msgs ...*message.Message) error {
	l.calls.Add(1)
	be := &core.BatchError{Errors: []core.MessageError{{UUID: uuid.NewString(), Err: errors.New("failed")}}}
	if l.named {
		be.Errors = append(be.Errors, core.MessageError{UUID: msgs[0].UUID, Err: errors.New("failed")})
	}
	return be
}

func (l *liar) Close() error { return nil }

// A BatchError naming messages the relay did not send says nothing
// trustworthy about the ones it did: the whole call counts as failed, and
// nothing is marked published (it used to be: a silent loss).
func TestRelayBatchErrorNamingUnknownMessagesFailsWholeCall(t *testing.T) {
	t.Parallel()
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "only unknown", true: "unknown and known"}[named], func(t *testing.T) {
			t.Parallel()
			db := pgtest.New(t)
			w := newWriter(t, db)
			ids := writeN(t, w, "t", 100, 10)
			pub := &liar{named: named}
			startRelay(t, db, outbox.RelayConfig{Publisher: pub, OutageBackoffMax: 20 * time.Millisecond, PollInterval: 10 * time.Millisecond})
			eventually(t, 30*time.Second, "several calls", func() bool { return pub.calls.Load() >= 5 })
			if n := countRows(t, db, "outbox_event", "published_at IS NOT NULL"); n != 0 {
				t.Fatalf("%d of %d events marked published although none was", n, len(ids))
			}
			if n := countRows(t, db, "outbox_pending", ""); n != len(ids) {
				t.Fatalf("%d pending, want %d", n, len(ids))
			}
		})
	}
}

// One of two brokers answers NOT_LEADER_FOR_PARTITION for a few seconds
// (the partial outage of the issue) while a relay with MaxAttempts 3 drains
// a backlog through kafka.Publisher: events of the sick broker's partitions
// fail (temporary) while the others flow; none is charged an attempt or
// dead-lettered, all arrive in order per key. A record too large for the
// publisher is dead-lettered at once.
func TestKafkaPartialOutageChargesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := kafkatest.Embedded(t, devkafka.Config{Brokers: 2, Partitions: 8})
	bundle := kafkaSetupWith(t, b.Addrs(), pgtest.Options{})
	if err := b.Cluster().CreateTopic(bundle.topic, 8, nil); err != nil {
		t.Fatal(err)
	}
	sick := b.Cluster().LeaderFor(bundle.topic, 0)
	var sickUntil atomic.Int64
	kafkatest.FailProduce(b, func(node int32) int16 {
		if node == sick && time.Now().UnixNano() < sickUntil.Load() {
			return kerr.NotLeaderForPartition.Code
		}
		return 0
	})

	poison, err := bundle.w.Write(ctx, outbox.Event{Topic: bundle.topic, PartitionKey: "poison", Payload: []byte(`{"blob":"` + strings.Repeat("x", 20_000) + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	ids := writeN(t, bundle.w, bundle.topic, 3000, 100)
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.Addrs(), MaxMessageBytes: 10_000, ClientOptions: []kgo.Opt{
		kgo.RecordDeliveryTimeout(time.Second),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }),
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	sickUntil.Store(time.Now().Add(4 * time.Second).UnixNano())
	startRelay(t, bundle.db, outbox.RelayConfig{Publisher: pub, BatchSize: 300, MaxAttempts: 3, RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, OutageBackoffMax: 100 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	c := consume(t, bundle.brokers, bundle.topic)
	eventually(t, 2*time.Minute, "all 3000 events consumed", func() bool { return c.unique() == len(ids) })
	eventually(t, 30*time.Second, "poison dead-lettered at once", func() bool {
		return countRows(t, bundle.db, "outbox_event", "dead_at IS NOT NULL AND attempts = 1 AND last_error LIKE '%too large%'") == 1
	})
	if n := countRows(t, bundle.db, "outbox_event", "last_error LIKE '%timed out%'"); n == 0 {
		t.Fatal("no event failed on the sick broker: the test did not test")
	}
	if n := countRows(t, bundle.db, "outbox_event", "attempts > 0 AND last_error NOT LIKE '%too large%'"); n != 0 {
		t.Fatalf("%d events charged attempts during a partial outage", n)
	}
	if c.count(poison[0]) != 0 {
		t.Fatal("poison reached the broker")
	}
	c.checkKeyOrder(t)
}
