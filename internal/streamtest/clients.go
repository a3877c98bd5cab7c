package streamtest

import (
	"context"
	"errors"
	"testing"
	"time"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
)

// The Watermill adapters, configured as millrace's tests (and a user) would
// run them across outages. Each is closed when the test ends.

// RedisClient connects to url with short timeouts, so that a dead server
// fails a call within a second or two instead of hanging a batch.
func RedisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, 2*time.Second, 2*time.Second
	return redis.NewClient(opts)
}

// RedisPublisher is watermill-redisstream's publisher, unchanged: each
// topic is a stream, each message one XADD.
func RedisPublisher(t testing.TB, url string) *redisstream.Publisher {
	t.Helper()
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: RedisClient(t, url)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// RedisSubscriber reads streams from their start as one consumer of
// consumer group group. A nacked message is sent again at once, before the
// next. Its reader stops at once when the test ends (by default it sleeps
// half a second after the read error a cancelled read is, outliving Close;
// a read error with the subscriber open is still logged and retried).
func RedisSubscriber(t testing.TB, url, group string) *redisstream.Subscriber {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
		Client: RedisClient(t, url), ConsumerGroup: group, OldestId: "0",
		DisableIndefiniteInitialBlock: true, // so Close does not wait on a blocked XREADGROUP
		ShouldStopOnReadErrors: func(err error) bool {
			// Closing cancels the read (a Router closes its subscribers).
			return ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed)
		},
	}, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
	})
	return sub
}

// natsOptions keep a client reconnecting for as long as the server is away
// (nats.go gives up after 60 tries by default, two minutes, and the client
// is then closed for good) and fail a publish at once while disconnected
// instead of buffering it (a buffered JetStream publish times out
// unacknowledged and goes out again after the reconnect anyway).
func natsOptions() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1), nats.Timeout(time.Second)}
}

// NATSPublisher is watermill-nats's JetStream publisher, unchanged: a topic
// is a stream of one subject (created when missing), each message one
// publish the server acknowledges. trackMsgID sends the message UUID as
// Nats-Msg-Id, so the server drops a duplicate within its dedup window
// (two minutes by default).
func NATSPublisher(t testing.TB, url string, trackMsgID bool) *wnats.Publisher {
	t.Helper()
	pub, err := wnats.NewPublisher(wnats.PublisherConfig{
		URL: url, NatsOptions: natsOptions(),
		JetStream: wnats.JetStreamConfig{AutoProvision: true, TrackMsgId: trackMsgID, ConnectOptions: []nats.JSOpt{nats.MaxWait(2 * time.Second)}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	return pub
}

// NATSSubscriber reads a topic's stream from its start through the durable
// consumer durable: one subscriber, one message in flight at a time
// (MaxAckPending 1: the next message is delivered only after the previous
// is acknowledged, so a redelivery never overtakes it), acknowledged
// synchronously.
func NATSSubscriber(t testing.TB, url, durable string) *wnats.Subscriber {
	t.Helper()
	sub, err := wnats.NewSubscriber(wnats.SubscriberConfig{
		URL: url, NatsOptions: natsOptions(), SubscribersCount: 1, AckWaitTimeout: 30 * time.Second,
		JetStream: wnats.JetStreamConfig{
			AutoProvision: true, DurablePrefix: durable,
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.MaxAckPending(1)},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sub.Close(); err != nil {
			t.Error(err)
		}
	})
	return sub
}
