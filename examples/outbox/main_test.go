package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// syncBuffer collects the demo's progress log from its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The whole demo with small numbers, against real PostgreSQL and the Kafka
// protocol (an embedded broker, or KAFKA_BROKERS): every check holds, the
// figures add up, and the demo's schema is gone afterwards. Then each check
// is shown to fail when the fact it checks is broken.
func TestDemo(t *testing.T) {
	t.Parallel()
	log := &syncBuffer{}
	cfg := config{
		DatabaseURL: pgtest.URL(),
		Brokers:     devkafka.EnvBrokers(),
		Orders:      300,
		Customers:   20,
		Writers:     4,
		RejectEvery: 50,
		Timeout:     time.Minute,
		Log:         log,
	}
	ctx := context.Background()
	sum, err := run(ctx, cfg)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("demo log:\n%s", log.String())
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sum.print(&out)
	t.Logf("summary:\n%s", out.String())

	if len(sum.checks) != 7 {
		t.Fatalf("%d checks ran, want 7: %+v", len(sum.checks), sum.checks)
	}
	for _, c := range sum.failed() {
		t.Errorf("check failed: %s", c.Detail)
	}
	// 300 orders, every 50th rolled back.
	if sum.committed != 294 || len(sum.rejected) != 6 {
		t.Errorf("committed %d, rolled back %d; want 294 and 6", sum.committed, len(sum.rejected))
	}
	if sum.applied != 294 || sum.invoices != 294 {
		t.Errorf("applied %d, invoices %d; want 294 each", sum.applied, sum.invoices)
	}
	// The replay really delivered the customer's events twice, and the
	// dedup skipped them: deliveries exceed applications by at least that.
	if sum.replay.events < 1 || sum.delivered-sum.applied < sum.replay.events {
		t.Errorf("replayed %d events, delivered %d, applied %d: the replay did not reach billing twice",
			sum.replay.events, sum.delivered, sum.applied)
	}
	// The relays published every event: orders, invoices, the replay.
	if got, want := sum.relayAPublished+sum.relayBPublished, 2*294+sum.replay.events; got < want {
		t.Errorf("relays published %d events, want at least %d", got, want)
	}
	if !strings.Contains(out.String(), "all checks passed") {
		t.Error("summary does not say all checks passed")
	}
	if !strings.Contains(log.String(), "relay-a stopped") {
		t.Errorf("progress log lacks the relay stop:\n%s", log.String())
	}

	// The schema is dropped (no -keep).
	pool, err := pgtest.Connect(ctx, pgtest.URL(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, sum.schema).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("schema %s still exists", sum.schema)
	}

	// Each check fails when its fact is broken.
	for _, tc := range []struct {
		check  string
		break_ func(s *summary)
	}{
		{"nothing lost", func(s *summary) { s.applied-- }},
		{"every committed order billed exactly once", func(s *summary) { s.wrongBalances = 1 }},
		{"every committed order billed exactly once", func(s *summary) { s.billedTotalCents += 100 }},
		{"no rolled-back order billed", func(s *summary) { s.rejectedEvents = 1 }},
		{"no rolled-back order billed", func(s *summary) { s.rejectedDelivered = 1 }},
		{"per-customer order preserved", func(s *summary) { s.outOfOrder = []string{"customer-001's order #3 arrived when #2 was due"} }},
		{"the replay billed nothing twice", func(s *summary) { s.balanceAfter += 100 }},
		{"the replay billed nothing twice", func(s *summary) { s.replayDelivered = s.replay.events }},
		{"one invoice per billed order", func(s *summary) { s.invoicesDistinct-- }},
		{"relay-b took over relay-a's lanes", func(s *summary) { s.pendingAtEnd = 1 }},
	} {
		broken := *sum
		tc.break_(&broken)
		broken.evaluate()
		failed := broken.failed()
		if len(failed) != 1 || failed[0].Name != tc.check {
			t.Errorf("breaking %q: failed checks %+v, want just that one", tc.check, failed)
		}
	}
}

// The delivery log accepts redeliveries and replays, and catches a customer's
// order arriving before an earlier one.
func TestDeliveryLogOrder(t *testing.T) {
	t.Parallel()
	ev := func(order int64, customer string, seq int) OrderPlaced {
		return OrderPlaced{OrderID: order, CustomerID: customer, CustomerSeq: seq}
	}
	l := newDeliveryLog()
	for _, e := range []OrderPlaced{
		ev(1, "a", 1), ev(2, "b", 1), ev(3, "a", 2), ev(1, "a", 1), ev(4, "a", 3), // a redelivery of order 1
		ev(1, "a", 1), ev(3, "a", 2), ev(4, "a", 3), // a replay of a's orders
	} {
		l.record(e)
	}
	total, distinct, ofA, bad := l.snapshot([]int64{1, 3, 4})
	if total != 8 || distinct != 4 || ofA != 7 || len(bad) != 0 {
		t.Fatalf("total %d, distinct %d, deliveries of a's orders %d, out of order %v; want 8, 4, 7, none", total, distinct, ofA, bad)
	}
	if !l.allRedelivered([]int64{1, 3, 4}) || l.allRedelivered([]int64{2}) {
		t.Fatal("allRedelivered is wrong")
	}

	l.record(ev(6, "b", 3)) // b's #2 has not arrived
	l.record(ev(5, "b", 2))
	if _, _, _, bad := l.snapshot(nil); len(bad) != 2 || !strings.Contains(bad[0], "#3 arrived when #2 was due") {
		t.Fatalf("out of order = %q, want #3 before #2 and #2 after #3 reported", bad)
	}
}
