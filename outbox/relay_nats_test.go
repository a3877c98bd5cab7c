package outbox_test

import (
	"context"
	"testing"
	"time"

	wnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/nats-io/nats.go"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// natsOptions keep a client reconnecting for as long as the server is away
// (nats.go gives up after 60 tries by default, two minutes, and the
// publisher is then closed for good) and fail a publish at once while
// disconnected instead of buffering it (a buffered JetStream publish times
// out unacknowledged and goes out again after the reconnect anyway).
func natsOptions() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1), nats.Timeout(time.Second)}
}

// newNATSPublisher is watermill-nats's JetStream publisher, unchanged: a
// topic is a stream of one subject (created when missing), each message one
// publish acknowledged by the server. trackMsgID sends the message UUID as
// Nats-Msg-Id, so the server drops a duplicate within its dedup window
// (two minutes by default).
func newNATSPublisher(t *testing.T, url string, trackMsgID bool) *wnats.Publisher {
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

// natsSubscriberConfig reads a subject's stream from its start through the
// durable consumer durable, one subscriber, one message in flight at a time
// (MaxAckPending 1: the next message is delivered only after the previous
// is acknowledged, so a redelivery never overtakes it), acknowledged
// synchronously.
func natsSubscriberConfig(url, durable string) wnats.SubscriberConfig {
	return wnats.SubscriberConfig{
		URL: url, NatsOptions: natsOptions(), SubscribersCount: 1, AckWaitTimeout: 30 * time.Second,
		JetStream: wnats.JetStreamConfig{
			AutoProvision: true, DurablePrefix: durable,
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.MaxAckPending(1)},
		},
	}
}

// consumeNATS reads topic from its start with a fresh durable consumer,
// acknowledging each message, until the test ends.
func consumeNATS(t *testing.T, url, topic string) *deliveries {
	t.Helper()
	sub, err := wnats.NewSubscriber(natsSubscriberConfig(url, pgtest.RandomName("verify")), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := sub.Subscribe(ctx, topic)
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

// The relay publishes to NATS JetStream through watermill-nats, unchanged:
// every event arrives, each key's in commit order (a stream of one subject
// is totally ordered), as one subscriber of a durable consumer reads them.
func TestRelayPublishesToNATSJetStream(t *testing.T) {
	t.Parallel()
	url := streamtest.NATSURL(t)
	db := pgtest.New(t)
	topic := pgtest.RandomName("millrace_test")
	ids := writeN(t, newWriter(t, db), topic, 2_000, 20)
	startRelay(t, db, outbox.RelayConfig{Publisher: newNATSPublisher(t, url, false), Workers: 4})
	eventually(t, time.Minute, "backlog drained", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	d := consumeNATS(t, url, topic)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	if dups := d.check(t, ids); dups != 0 {
		t.Fatalf("%d duplicates without a failure", dups)
	}
}

// NATS JetStream outage mid-drain: a private nats-server -js is killed with
// SIGKILL while the relay drains 5,000 events over 50 keys, and restarted
// on the same port and store directory three seconds later. A separate
// consumer then sees every event (0 lost; duplicates allowed, counted),
// each key's in commit order; the relay dead-letters nothing.
func TestRelayNATSJetStreamOutageMidDrain(t *testing.T) {
	t.Parallel()
	srv := streamtest.StartNATS(t)
	db := pgtest.New(t)
	topic := pgtest.RandomName("millrace_test")
	ids := drainThroughOutage(t, db, srv, topic, newNATSPublisher(t, srv.URL, false))
	d := consumeNATS(t, srv.URL, topic)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	dups := d.check(t, ids)
	t.Logf("NATS JetStream: %d events, 0 lost, %d duplicates", len(ids), dups)
}
