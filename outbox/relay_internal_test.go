package outbox

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/internal/pgtest"
)

type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// After a LISTEN connection that worked is lost, the relay reconnects after
// the shortest wait, however many connections it lost before: the backoff
// grows only while reconnects fail. Without the reset, the 6th and 7th
// reconnect wait 3.2s and 6.4s.
func TestListenBackoffResetsAfterAConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, Workers: 1, PollInterval: time.Minute, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	listener := func() int32 {
		var pid int32
		err := db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE query = $1 AND state = 'idle'`,
			`LISTEN "`+r.channel+`"`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	waitListener := func(old int32) (int32, time.Duration) {
		start := time.Now()
		deadline := start.Add(30 * time.Second)
		for {
			if pid := listener(); pid != 0 && pid != old {
				return pid, time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatal("relay did not LISTEN again within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	pid, _ := waitListener(0)
	for i := 1; i <= 7; i++ {
		if _, err := db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		var took time.Duration
		pid, took = waitListener(pid)
		if i >= 6 && took > 2500*time.Millisecond {
			t.Fatalf("reconnect %d after a working LISTEN connection took %v: the backoff did not reset", i, took)
		}
	}
}

// An empty poll allocates what it claims, not BatchSize rows. Not parallel:
// it reads the process's allocation counter.
func TestEmptyClaimAllocatesLittle(t *testing.T) {
	db := pgtest.New(t)
	r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, BatchSize: MaxBatchSize})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	least := ^uint64(0)
	for range 5 {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rows, err := r.claimRows(ctx, tx, []int16{0, 1, 2})
		runtime.ReadMemStats(&after)
		tx.Rollback(ctx) //nolint:errcheck
		if err != nil || len(rows) != 0 {
			t.Fatalf("claim on an empty outbox: %d rows, %v", len(rows), err)
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if least > 256<<10 {
		t.Fatalf("an empty claim with BatchSize %d allocated %d bytes", MaxBatchSize, least)
	}
}
