package outbox_test

import (
	"testing"
	"time"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// consumeRedis reads stream from its start as the one consumer of a fresh
// consumer group, acknowledging each message, until the test ends.
func consumeRedis(t *testing.T, url, stream string) *deliveries {
	t.Helper()
	return record(t, streamtest.RedisSubscriber(t, url, pgtest.RandomName("verify")), stream)
}

// The relay publishes to Redis Streams through watermill-redisstream,
// unchanged: every event arrives, each key's in commit order (a stream is
// totally ordered and the relay publishes a key's events in order), as the
// one consumer of a consumer group reads them.
func TestRelayPublishesToRedisStreams(t *testing.T) {
	t.Parallel()
	url := streamtest.RedisURL(t)
	db := pgtest.New(t)
	stream := pgtest.RandomName("millrace_test")
	ids := writeN(t, newWriter(t, db), stream, 2_000, 20)
	startRelay(t, db, outbox.RelayConfig{Publisher: streamtest.RedisPublisher(t, url), Workers: 4})
	eventually(t, time.Minute, "backlog drained", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	d := consumeRedis(t, url, stream)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	if dups := d.check(t, ids); dups != 0 {
		t.Fatalf("%d duplicates without a failure", dups)
	}
}

// Redis Streams outage mid-drain: a private redis-server (append-only,
// appendfsync always) is killed with SIGKILL while the relay drains 5,000
// events over 50 keys, and restarted on the same port and directory three
// seconds later. A separate consumer then sees every event (0 lost;
// duplicates allowed, counted), each key's in commit order; the relay
// dead-letters nothing.
func TestRelayRedisStreamsOutageMidDrain(t *testing.T) {
	t.Parallel()
	srv := streamtest.StartRedis(t)
	db := pgtest.New(t)
	stream := pgtest.RandomName("millrace_test")
	ids := drainThroughOutage(t, db, srv, stream, streamtest.RedisPublisher(t, srv.URL))
	d := consumeRedis(t, srv.URL, stream)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	dups := d.check(t, ids)
	t.Logf("Redis Streams: %d events, 0 lost, %d duplicates", len(ids), dups)
}

// What Redis Streams does not keep: two consumers of one consumer group
// split the stream message by message, whatever the key, so a key's events
// are handled by both at once and per-key order is lost. (Order per key
// holds with one consumer per group, as the other tests read.)
func TestRedisStreamsConsumerGroupOfTwoSplitsKeys(t *testing.T) {
	t.Parallel()
	url := streamtest.RedisURL(t)
	db := pgtest.New(t)
	stream := pgtest.RandomName("millrace_test")
	ids := writeN(t, newWriter(t, db), stream, 1_000, 10)
	startRelay(t, db, outbox.RelayConfig{Publisher: streamtest.RedisPublisher(t, url)})
	eventually(t, time.Minute, "backlog drained", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	group := pgtest.RandomName("group")
	a := record(t, streamtest.RedisSubscriber(t, url, group), stream)
	b := record(t, streamtest.RedisSubscriber(t, url, group), stream)
	eventually(t, time.Minute, "all events consumed", func() bool { return a.unique()+b.unique() >= len(ids) })
	keysOf := func(d *deliveries) map[string]bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		keys := map[string]bool{}
		for _, m := range d.list {
			keys[m.key] = true
		}
		return keys
	}
	ka, kb := keysOf(a), keysOf(b)
	shared := 0
	for k := range ka {
		if kb[k] {
			shared++
		}
	}
	if shared == 0 {
		t.Fatalf("the two consumers got disjoint keys (%d and %d messages): the group kept keys apart", a.unique(), b.unique())
	}
	t.Logf("%d and %d messages; %d of 10 keys went to both consumers", a.unique(), b.unique(), shared)
}
