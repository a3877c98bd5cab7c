package outbox_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

const (
	relayChildSchemaEnv = "MILLRACE_OUTBOX_CHILD_SCHEMA"
	// relayChildKillAtEnv is the number of the acknowledged publish after
	// which the child announces itself ready to be killed; 0 (or unset):
	// when the outbox is drained.
	relayChildKillAtEnv = "MILLRACE_OUTBOX_CHILD_KILL_AT"
)

// TestHelperRelayChild is not a test: TestRelayKilledBetweenAckAndMark runs
// the test binary again with this test selected. It runs a relay on the
// schema it is given, publishing to the brokers in KAFKA_BROKERS, in small
// batches on two workers. After the broker acknowledged its KILL_AT-th
// batch, before that batch's mark, the worker announces it is ready and
// waits to be killed; the other worker keeps going until the kill lands.
func TestHelperRelayChild(t *testing.T) {
	schema := os.Getenv(relayChildSchemaEnv)
	if schema == "" {
		t.Skip("helper process for TestRelayKilledBetweenAckAndMark")
	}
	killAt, _ := strconv.ParseInt(os.Getenv(relayChildKillAtEnv), 10, 64)
	ctx := context.Background()
	pool, err := pgtest.Connect(ctx, pgtest.URL(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: devkafka.EnvBrokers()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var acked atomic.Int64
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, BatchSize: 10, Workers: 2, PollInterval: 20 * time.Millisecond,
		Publisher: &afterPublish{Publisher: pub, after: func() {
			if acked.Add(1) == killAt {
				childtest.Announce()
				select {} // acknowledged, not marked: killed here
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	if killAt > 0 {
		t.Fatal(<-done) // the relay does not stop by itself
	}
	for {
		var pending int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+schema+`".outbox_pending`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			childtest.Announce()
			select {}
		}
		select {
		case err := <-done:
			t.Fatal(err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A relay process SIGKILLed 50 times, each time after the broker
// acknowledged a batch and before the batch's mark committed (at a random
// batch of each run, while its other worker is mid-batch), and started
// again, drains a backlog of 2,500 events over 100 keys through the
// idempotent producer. A separate consumer then reads the whole topic: no
// event lost, and the first copies of each key's events in the order they
// were written; duplicates (the batches acknowledged but not marked) are
// allowed, and must be there, or the kills did not land between ack and
// mark.
func TestRelayKilledBetweenAckAndMark(t *testing.T) {
	t.Parallel()
	bundle := kafkaSetup(t)
	const events, keys, kills, maxKillAt = 2500, 100, 50, 8
	ids := writeN(t, bundle.w, bundle.topic, events, keys)
	env := []string{relayChildSchemaEnv + "=" + bundle.db.Schema, "KAFKA_BROKERS=" + strings.Join(bundle.brokers, ",")}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))

	start := time.Now()
	for k := range kills {
		// Each run needs a few batches of backlog to reach its kill point.
		if left := countRows(t, bundle.db, "outbox_pending", ""); left < 4*10*maxKillAt {
			t.Fatalf("only %d events left after %d kills: the backlog is too small for %d kills", left, k, kills)
		}
		killAt := 1 + rng.IntN(maxKillAt)
		childtest.KillAtReady(t, "TestHelperRelayChild", append(env, relayChildKillAtEnv+"="+strconv.Itoa(killAt)), time.Minute)
	}
	left := countRows(t, bundle.db, "outbox_pending", "")
	// The rest is drained by one more run, killed once the outbox is empty.
	childtest.KillAtReady(t, "TestHelperRelayChild", env, 2*time.Minute)
	drain := time.Since(start)
	if n := countRows(t, bundle.db, "outbox_event", "published_at IS NOT NULL"); n != events {
		t.Fatalf("%d of %d events marked published", n, events)
	}

	records := kafkatest.RecordCount(t, bundle.brokers, bundle.topic)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	seen := map[string]bool{}
	last := map[string]int{}
	var violations, duplicates int
	for _, m := range kafkatest.Read(t, bundle.brokers, bundle.topic, int(records)) {
		if !want[m.UUID] {
			t.Fatalf("unexpected message %s", m.UUID)
		}
		if seen[m.UUID] {
			duplicates++
			continue
		}
		seen[m.UUID] = true
		seq, key := seqAndKey(t, m)
		if prev, ok := last[key]; ok && seq <= prev {
			violations++
			t.Errorf("key %s: seq %d first arrived after seq %d", key, seq, prev)
		}
		last[key] = seq
	}
	lost := events - len(seen)
	t.Logf("events %d, keys %d, kills %d (%d events left after them), records %d, lost %d, order violations %d, duplicates %d, drain %s",
		events, keys, kills, left, records, lost, violations, duplicates, drain.Round(time.Millisecond))
	if lost != 0 || violations != 0 {
		t.Fatalf("%d lost, %d order violations; want 0 and 0", lost, violations)
	}
	if duplicates < kills {
		t.Fatalf("%d duplicates after %d kills between ack and mark: the kills did not land there", duplicates, kills)
	}
}

// seqAndKey reads the seq writeN put in the payload, and the record key.
func seqAndKey(t *testing.T, m *message.Message) (int, string) {
	t.Helper()
	var body struct{ Seq int }
	if err := json.Unmarshal(m.Payload, &body); err != nil {
		t.Fatalf("message %s: %v", m.UUID, err)
	}
	key, _ := wkafka.MessageKeyFromCtx(m.Context())
	return body.Seq, string(key)
}
