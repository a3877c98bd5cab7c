package outbox_test

import (
	"testing"
	"time"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/streamtest"
	"github.com/millrace/millrace/outbox"
)

// consumeNATS reads topic from its start with a fresh durable consumer,
// acknowledging each message, until the test ends.
func consumeNATS(t *testing.T, url, topic string) *deliveries {
	t.Helper()
	return record(t, streamtest.NATSSubscriber(t, url, pgtest.RandomName("verify")), topic)
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
	startRelay(t, db, outbox.RelayConfig{Publisher: streamtest.NATSPublisher(t, url, false), Workers: 4})
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
	ids := drainThroughOutage(t, db, srv, topic, streamtest.NATSPublisher(t, srv.URL, false))
	d := consumeNATS(t, srv.URL, topic)
	eventually(t, time.Minute, "all events consumed", func() bool { return d.unique() == len(ids) })
	dups := d.check(t, ids)
	t.Logf("NATS JetStream: %d events, 0 lost, %d duplicates", len(ids), dups)
}
