package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/kafkacluster"
	"github.com/millrace/millrace/internal/pgtest"
)

// The order saga, faults on, while the three nodes of the cluster are
// restarted one at a time (SIGTERM, then started again, the cluster whole
// again before the next): every saga ends completed or compensated, and
// effects match outcomes one to one, counted from the databases. A node
// takes 20 to 60 s to come back on two busy cores, so the demo runs in
// rounds of 150 sagas (15 s at 10 a second) until the roll is over; each
// round is checked on its own, and the last one ends after the roll did.
// Short rounds keep the time the test runs on after the roll short.
func TestFailoverRollingRestart(t *testing.T) {
	c := kafkacluster.Require(t)
	admin, err := pgtest.Connect(context.Background(), pgtest.URL(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg      sync.WaitGroup
		rolled  []string
		rollErr error
		done    atomic.Bool
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer done.Store(true)
		// Let the first sagas start flowing before the first node goes.
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return
		}
		for _, n := range c.Nodes() {
			start := time.Now()
			if err := c.Terminate(n); err != nil {
				rollErr = err
				return
			}
			if err := c.Start(ctx, n); err != nil {
				rollErr = err
				return
			}
			if err := c.WaitHealthy(ctx); err != nil {
				rollErr = err
				return
			}
			rolled = append(rolled, fmt.Sprintf("node %d back in %v", n, time.Since(start).Round(100*time.Millisecond)))
		}
	}()

	var total, completed, compensated int64
	rounds := 0
	for ; rounds == 0 || !done.Load(); rounds++ {
		if rounds == 20 {
			t.Fatalf("the roll did not finish during 20 rounds of the demo (%v)", rolled)
		}
		log, out := &syncBuffer{}, &syncBuffer{}
		cfg := config{
			DatabaseURL: pgtest.URL(),
			Brokers:     c.Brokers(),
			Service:     "all",
			Name:        fmt.Sprintf("ordersaga_roll_%s_%d", randomHex(4), rounds),
			Sagas:       150,
			Seed:        uint64(11 + rounds),
			Writers:     4,
			Conns:       4,
			Rate:        10,
			Faults:      true,
			Timeout:     5 * time.Minute,
			Log:         log,
			Out:         out,
		}
		t.Cleanup(func() {
			for _, s := range (names{cfg.Name}).schemas() {
				_, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
			}
		})
		res, err := run(ctx, cfg)
		if err != nil {
			t.Fatalf("round %d: %v\nprogress:\n%s", rounds, err, log.String())
		}
		res.print(out)
		ok := res.ok()
		for _, ch := range res.checks {
			if !ch.ok {
				t.Errorf("round %d: check %q failed: %s", rounds, ch.name, ch.detail)
			}
		}
		if res.sagas.completed+res.sagas.compensated != int64(cfg.Sagas) || res.sagas.stuck != 0 {
			t.Errorf("round %d: sagas %+v: want all %d completed or compensated", rounds, res.sagas, cfg.Sagas)
			ok = false
		}
		if e := res.effects; e.shipments != res.sagas.completed {
			t.Errorf("round %d: effects %+v: want one shipment per completed saga (%d)", rounds, e, res.sagas.completed)
			ok = false
		}
		if !ok {
			t.Fatalf("round %d failed; progress:\n%s\nsummary:\n%s", rounds, log.String(), out.String())
		}
		total += int64(cfg.Sagas)
		completed += res.sagas.completed
		compensated += res.sagas.compensated
	}
	wg.Wait()
	if rollErr != nil {
		t.Fatalf("rolling restart: %v", rollErr)
	}
	if len(rolled) != 3 {
		t.Fatalf("the roll restarted %d nodes: %v", len(rolled), rolled)
	}
	t.Logf("rolling restart (%v) during %d rounds, %d sagas: completed=%d compensated=%d stuck=0 lost_events=0, effects one to one",
		rolled, rounds, total, completed, compensated)
}
