package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/kafkacluster"
	"github.com/millrace/millrace/internal/pgtest"
)

// The order saga, faults on, while the three nodes of the cluster are
// restarted one at a time (SIGTERM, then started again, the cluster whole
// again before the next): every saga ends completed or compensated, and
// effects match outcomes one to one, counted from the databases.
func TestFailoverRollingRestart(t *testing.T) {
	c := kafkacluster.Require(t)
	log, out := &syncBuffer{}, &syncBuffer{}
	cfg := config{
		DatabaseURL: pgtest.URL(),
		Brokers:     c.Brokers(),
		Service:     "all",
		Name:        "ordersaga_roll_" + randomHex(4),
		Sagas:       1200,
		Seed:        11,
		Writers:     4,
		Conns:       4,
		Rate:        10, // 120 s of orders: the roll takes one to two minutes on two cores
		Faults:      true,
		Timeout:     5 * time.Minute,
		Log:         log,
		Out:         out,
	}
	admin, err := pgtest.Connect(context.Background(), pgtest.URL(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range (names{cfg.Name}).schemas() {
			_, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}
		admin.Close()
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("progress:\n%s\nsummary:\n%s", log.String(), out.String())
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg       sync.WaitGroup
		rolled   []string
		rollErr  error
		rollDone time.Time
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Let the sagas start flowing before the first node goes.
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
		rollDone = time.Now()
	}()

	res, err := run(ctx, cfg)
	runDone := time.Now()
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if rollErr != nil {
		t.Fatalf("rolling restart: %v", rollErr)
	}
	if len(rolled) != 3 || rollDone.After(runDone) {
		t.Fatalf("the roll did not finish while the sagas ran (%v)", rolled)
	}
	res.print(out)
	for _, ch := range res.checks {
		if !ch.ok {
			t.Errorf("check %q failed: %s", ch.name, ch.detail)
		}
	}
	if !res.ok() {
		t.Errorf("the demo's checks failed")
	}
	if res.sagas.completed+res.sagas.compensated != int64(cfg.Sagas) || res.sagas.stuck != 0 {
		t.Errorf("sagas %+v: want all %d completed or compensated", res.sagas, cfg.Sagas)
	}
	if e := res.effects; e.shipments != res.sagas.completed {
		t.Errorf("effects %+v: want one shipment per completed saga (%d)", e, res.sagas.completed)
	}
	t.Logf("rolling restart (%v) during %d sagas: completed=%d compensated=%d stuck=%d lost_events=%d effects=%+v",
		rolled, cfg.Sagas, res.sagas.completed, res.sagas.compensated, res.sagas.stuck, res.lost.total(), res.effects)
}
