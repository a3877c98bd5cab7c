package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/devbroker"
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

func checkName(s string) error {
	if !validName.MatchString(s) {
		return fmt.Errorf("%q: use lower-case letters, digits and _ (at most 41), starting with a letter", s)
	}
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// broker starts the embedded broker when cfg names none: on a free port
// with every service in this process, on cfg.BrokerPort for the orders
// service of a run in separate processes. For the other services of such a
// run it points cfg at 127.0.0.1:BrokerPort and waits for it to answer.
func broker(ctx context.Context, cfg *config, lg *logger) (closeFn func(), kind string, err error) {
	if len(cfg.Brokers) > 0 {
		return func() {}, "KAFKA_BROKERS", waitForBroker(ctx, cfg.Brokers, cfg.Timeout)
	}
	switch cfg.Service {
	case "all", "orders":
		port := 0
		if cfg.Service == "orders" {
			port = cfg.BrokerPort
		}
		b, err := devbroker.Start(devbroker.Config{Port: port, Partitions: partitions})
		if err != nil {
			return nil, "", err
		}
		cfg.Brokers = b.Addrs()
		return b.Close, "embedded broker", nil
	}
	cfg.Brokers = []string{"127.0.0.1:" + strconv.Itoa(cfg.BrokerPort)}
	lg.say("waiting for the orders service's embedded broker at %s", cfg.Brokers[0])
	return func() {}, "the orders service's embedded broker", waitForBroker(ctx, cfg.Brokers, cfg.Timeout)
}

func waitForBroker(ctx context.Context, brokers []string, timeout time.Duration) error {
	return waitFor(ctx, timeout, func(ctx context.Context) (bool, error) {
		c, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
		if err != nil {
			return false, err
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := c.Ping(ctx); err != nil {
			return false, err
		}
		return true, nil
	})
}

// serveParticipant runs one participant service until ctx ends.
func serveParticipant(ctx context.Context, cfg config) error {
	lg := &logger{w: cfg.Log, start: time.Now()}
	closeBroker, kind, err := broker(ctx, &cfg, lg)
	if err != nil {
		return err
	}
	defer closeBroker()
	p := newPlan(cfg.Sagas, cfg.Seed)
	var part *participant
	switch cfg.Service {
	case "payment":
		part, err = startPayment(ctx, cfg, lg, p)
	case "inventory":
		part, err = startInventory(ctx, cfg, lg, p)
	case "shipping":
		part, _, err = startShipping(ctx, cfg, lg, p)
	}
	if err != nil {
		return err
	}
	defer part.close()
	if _, err := part.pool.Exec(ctx, `CREATE TABLE service_ready (at timestamptz NOT NULL DEFAULT now()); INSERT INTO service_ready DEFAULT VALUES`); err != nil {
		return err
	}
	lg.say("%s: schema %s ready, consuming %s from %s (%s); Ctrl-C stops it", cfg.Service, part.schema,
		names{cfg.Name}.commands(cfg.Service), cfg.Brokers[0], kind)
	<-ctx.Done()
	return nil
}

// run runs the orders service, and with -service all the three others in
// this process too; places the orders with the faults; waits for every saga
// to end; counts from the databases. It returns an error only when the
// demo could not run; a failed check is in the result.
func run(ctx context.Context, cfg config) (_ *result, err error) {
	lg := &logger{w: cfg.Log, start: time.Now()}
	n := names{cfg.Name}
	closeBroker, kind, err := broker(ctx, &cfg, lg)
	if err != nil {
		return nil, err
	}
	defer closeBroker()
	admin, err := connect(ctx, cfg.DatabaseURL, "", 2)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	schemas := n.schemas()
	defer func() {
		if cfg.Service != "all" {
			return
		}
		if cfg.Keep {
			lg.say("kept schemas %v", schemas)
			return
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, s := range schemas {
			if _, derr := admin.Exec(dctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`); derr != nil {
				lg.say("could not drop schema %s: %v", s, derr)
			}
		}
	}()

	p := newPlan(cfg.Sagas, cfg.Seed)
	res := &result{cfg: cfg, kafka: kind}
	var parts []*participant
	var ship *shippingStats
	defer func() {
		for _, pt := range parts {
			pt.close()
		}
	}()
	if cfg.Service == "all" {
		for _, start := range []func() (*participant, error){
			func() (*participant, error) { return startPayment(ctx, cfg, lg, p) },
			func() (*participant, error) { return startInventory(ctx, cfg, lg, p) },
			func() (*participant, error) {
				pt, st, err := startShipping(ctx, cfg, lg, p)
				ship = st
				return pt, err
			},
		} {
			pt, err := start()
			if err != nil {
				return nil, err
			}
			parts = append(parts, pt)
		}
	}
	orders, err := startOrders(ctx, cfg, lg, p)
	if err != nil {
		return nil, err
	}
	defer orders.close()
	if cfg.Service == "orders" {
		lg.say("waiting for the payment, inventory and shipping services (-service ... -name %s)", cfg.Name)
		if err := waitFor(ctx, cfg.Timeout, func(ctx context.Context) (bool, error) {
			var ready int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE tablename = 'service_ready' AND schemaname = ANY($1)`,
				[]string{n.schema("payment"), n.schema("inventory"), n.schema("shipping")}).Scan(&ready)
			return ready == 3, err
		}); err != nil {
			return nil, fmt.Errorf("the other services did not come up: %w", err)
		}
	}
	lg.say("4 services, schemas %s_{orders,payment,inventory,shipping}{,_millrace}; Kafka at %s (%s)", cfg.Name, cfg.Brokers[0], kind)
	lg.say("placing %d orders at %d/s from %d goroutines; %d customers, %d SKUs, credit and stock for about 80%% of them; faults %s",
		cfg.Sagas, cfg.Rate, cfg.Writers, len(p.customers)-3, len(p.skus)-2, onOff(cfg.Faults))

	counter := &counter{admin: admin, n: n}
	prog := startProgress(ctx, lg, counter, orders)
	defer prog.stop()
	op := &operator{svc: orders, admin: admin, seen: map[string]bool{}}
	opCtx, stopOp := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(1)
	go func() { defer bg.Done(); op.watch(opCtx) }()
	defer func() { stopOp(); bg.Wait() }()

	// The orchestrator restart, when 40% of the sagas have ended.
	restartErr := make(chan error, 1)
	if cfg.Faults {
		bg.Add(1)
		go func() {
			defer bg.Done()
			err := waitFor(opCtx, cfg.Timeout, func(ctx context.Context) (bool, error) {
				c, err := counter.sagas(ctx)
				return c.ended() >= int64(cfg.Sagas)*4/10, err
			})
			if err == nil {
				err = orders.restartOrchestrator(opCtx, time.Second)
			}
			if opCtx.Err() == nil {
				restartErr <- err
			}
		}()
	}

	started := time.Now()
	if err := orders.placeOrders(ctx); err != nil {
		return nil, err
	}
	lg.say("all %d orders placed in %.1fs; waiting for their sagas to end", cfg.Sagas, time.Since(started).Seconds())
	if err := waitFor(ctx, cfg.Timeout, func(ctx context.Context) (bool, error) {
		select {
		case err := <-restartErr:
			if err != nil {
				return false, fatal{fmt.Errorf("restart the orchestrator: %w", err)}
			}
			res.restarted = true
		default:
		}
		c, err := counter.sagas(ctx)
		if err != nil || c.ended() < int64(cfg.Sagas) {
			return false, err
		}
		pending, err := counter.pending(ctx)
		if err != nil || pending > 0 {
			return false, err
		}
		lost, err := counter.lost(ctx)
		return err == nil && lost.total() == 0, err
	}); err != nil {
		res.waitErr = err
		lg.say("gave up waiting: %v", err)
	}
	if !res.restarted {
		select {
		case err := <-restartErr:
			res.restarted = err == nil
		default:
		}
	}
	res.elapsed = time.Since(started)
	prog.stop()

	// Stop everything before counting, so nothing moves under the checks.
	stopOp()
	bg.Wait()
	orders.stop()
	for _, pt := range parts {
		pt.stop()
	}
	res.operatorFixed, res.operatorUnknown = op.fixed.Load(), op.unknown.Load()
	orders.webhooks.Wait()
	res.confirmations, res.lateConfirmations = orders.confirmations.Load(), orders.lateConfirmations.Load()
	for _, s := range append([]*service{orders.service}, servicesOf(parts)...) {
		res.deliveries += s.deliveries()
		res.duplicatesSent += s.dup.dups.Load()
	}
	if ship != nil {
		res.carrierFailures = ship.failures.Load()
	}
	if err := res.collect(ctx, counter); err != nil {
		return nil, err
	}
	return res, nil
}

func servicesOf(parts []*participant) []*service {
	var out []*service
	for _, p := range parts {
		out = append(out, p.service)
	}
	return out
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// fatal is an error of a waitFor condition that ends the wait at once.
type fatal struct{ error }

func (f fatal) Unwrap() error { return f.error }

// waitFor polls cond every 100 ms until it holds, ctx ends, timeout passes,
// or cond fails with a fatal error.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond(ctx)
		if ok && err == nil {
			return nil
		}
		if f := (fatal{}); errors.As(err, &f) {
			return f.error
		}
		if err != nil && ctx.Err() == nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if ctx.Err() != context.DeadlineExceeded {
				return ctx.Err()
			}
			if lastErr != nil {
				return fmt.Errorf("gave up after %s (last error: %v)", timeout, lastErr)
			}
			return fmt.Errorf("gave up after %s", timeout)
		case <-tick.C:
		}
	}
}
