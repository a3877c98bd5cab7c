package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// redisClient connects to url with short timeouts, so that a dead server
// fails a call within a second or two instead of hanging the relay's batch.
func redisClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	return redis.NewClient(opts)
}

// newRedisPublisher is watermill-redisstream's publisher, unchanged: each
// topic is a stream, each message one XADD.
func newRedisPublisher(t *testing.T, url string) *redisstream.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: redisClient(t, url)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// redisSubscriberConfig reads a stream from its start in consumer group
// group. Its reader stops at once when ctx ends (by default it sleeps half a
// second after the read error a cancelled read is, outliving Close).
func redisSubscriberConfig(ctx context.Context, client redis.UniversalClient, group string) redisstream.SubscriberConfig {
	return redisstream.SubscriberConfig{
		Client: client, ConsumerGroup: group, OldestId: "0",
		DisableIndefiniteInitialBlock: true, // so Close does not wait on a blocked XREADGROUP
		ShouldStopOnReadErrors:        func(error) bool { return ctx.Err() != nil },
	}
}

// consumeRedis reads stream from its start as the one consumer of a fresh
// consumer group, acknowledging each message, until the test ends.
func consumeRedis(t *testing.T, url, stream string) *deliveries {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := redisstream.NewSubscriber(redisSubscriberConfig(ctx, redisClient(t, url), pgtest.RandomName("verify")), nil)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := sub.Subscribe(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	d := newDeliveries()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			d.add(m)
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
		<-done
	})
	return d
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
	startRelay(t, db, outbox.RelayConfig{Publisher: newRedisPublisher(t, url), Workers: 4})
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
	ids := drainThroughOutage(t, db, srv, stream, newRedisPublisher(t, srv.URL))
	d := consumeRedis(t, srv.URL, stream)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	dups := d.check(t, ids)
	t.Logf("Redis Streams: %d events, 0 lost, %d duplicates", len(ids), dups)
}
