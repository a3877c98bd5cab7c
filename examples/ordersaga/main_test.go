package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// syncBuffer collects the demo's output from its goroutines.
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

var lastLine = regexp.MustCompile(`^demo: sagas=(\d+) completed=(\d+) compensated=(\d+) stuck=(\d+) lost_events=(\d+) double_effects=(\d+)$`)

// The order saga with every fault, at a small size, against real
// PostgreSQL and the Kafka protocol: every saga ends completed or
// compensated, nothing stuck, no event lost, no double effect, each
// counted from the databases; each fault shows in the progress output and
// in the saga history. Then the counters are shown to catch a lost event,
// a double effect and a stuck saga planted in the databases.
func TestOrderSaga(t *testing.T) {
	t.Parallel()
	log, out := &syncBuffer{}, &syncBuffer{}
	cfg := config{
		DatabaseURL: pgtest.URL(),
		Brokers:     devkafka.EnvBrokers(),
		Service:     "all",
		Name:        "ordersaga_test_" + randomHex(4),
		Sagas:       60,
		Seed:        7,
		Writers:     4,
		Conns:       3, // the whole suite shares PostgreSQL's max_connections
		Rate:        30,
		Faults:      true,
		Timeout:     90 * time.Second,
		Keep:        true, // the test breaks the counts below, then drops the schemas
		Log:         log,
		Out:         out,
	}
	ctx := context.Background()
	admin, err := pgtest.Connect(ctx, pgtest.URL(), 2)
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

	res, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res.print(out)
	for _, c := range res.checks {
		if !c.ok {
			t.Errorf("check %q failed: %s", c.name, c.detail)
		}
	}
	if !res.ok() || len(res.checks) != 7 {
		t.Errorf("ok = %t with %d checks, want true with 7", res.ok(), len(res.checks))
	}

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	m := lastLine.FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("last line %q is not the demo line", lines[len(lines)-1])
	}
	want := fmt.Sprintf("demo: sagas=%d completed=%d compensated=%d stuck=0 lost_events=0 double_effects=0",
		cfg.Sagas, res.sagas.completed, res.sagas.compensated)
	if m[0] != want {
		t.Errorf("last line %q, want %q", m[0], want)
	}
	if res.sagas.completed == 0 || res.sagas.compensated == 0 || res.sagas.completed+res.sagas.compensated != int64(cfg.Sagas) {
		t.Errorf("sagas %+v: want both outcomes, adding up to %d", res.sagas, cfg.Sagas)
	}
	// Compensations undid both kinds of effect: credit released, stock
	// returned (the fraud check fails sagas after their stock is taken).
	if e := res.effects; e.released == 0 || e.returned == 0 || e.reserved == 0 || e.taken == 0 || e.shipments != res.sagas.completed ||
		e.children != res.sagas.completed {
		t.Errorf("effects %+v: want credit released and stock returned, one shipment and one shipping child saga per completed saga", e)
	}

	// Each fault happened and is told in the progress output.
	for _, s := range []string{
		"fault: inventory: its reply to " + newPlan(cfg.Sagas, cfg.Seed).slowStock,
		"fault: orders service stopped",
		"fault: orders service restarted",
		"release of " + newPlan(cfg.Sagas, cfg.Seed).flakyRelease + "'s credit fails (2 of 2",
		"credit succeeds on try 3",
		"operator: saga " + newPlan(cfg.Sagas, cfg.Seed).heldRelease + " is stuck",
		"operator: lifted the refund hold",
		"fault: shipping: carrier API down",
		"sagas started",
		"waiting for payment_confirmed",
	} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("progress output lacks %q", s)
		}
	}
	// The wait step: the payment confirmations came, some before their
	// saga waited for them.
	if res.confirmations == 0 || res.earlyConfirmations == 0 {
		t.Errorf("payment confirmations %d, early %d: want some of each", res.confirmations, res.earlyConfirmations)
	}
	h := res.history
	if res.duplicatesSent == 0 || res.deliveries <= res.marks || h.timeouts == 0 || h.fenced == 0 ||
		h.compFailures < 2+undoAttempts || h.stuck != 1 || h.operator != 1 || res.carrierFailures == 0 {
		t.Errorf("faults: duplicates %d, deliveries %d, marks %d, history %+v, carrier failures %d",
			res.duplicatesSent, res.deliveries, res.marks, h, res.carrierFailures)
	}

	// The counters are not blind: plant each kind of damage in the
	// databases and count again.
	c := &counter{admin: admin, n: names{cfg.Name}}
	// The webhook found each saga by the provider's payment id, a
	// correlation key (saga.SignalByKeyTx).
	var keyed int64
	err = admin.QueryRow(ctx, `SELECT count(*) FROM `+c.mtable("orders", "saga_event")+` WHERE key_name = 'payment_id' AND state = 'consumed'`).Scan(&keyed)
	if err != nil || keyed == 0 || keyed > res.confirmations {
		t.Errorf("payment confirmations consumed by payment id: %d of %d taken (%v)", keyed, res.confirmations, err)
	}
	count := func() *result {
		t.Helper()
		r := &result{cfg: cfg, restarted: true, duplicatesSent: 1, deliveries: res.deliveries, operatorFixed: 1}
		if err := r.collect(ctx, c); err != nil {
			t.Fatal(err)
		}
		return r
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := admin.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	if r := count(); !r.ok() {
		t.Fatalf("recounting the intact databases fails: %+v", r.checks)
	}
	var completed string
	if err := admin.QueryRow(ctx, `SELECT id FROM `+c.mtable("orders", "saga_instance")+` WHERE status = 'completed' AND parent = '' LIMIT 1`).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	// Stock taken twice for a completed saga.
	exec(`INSERT INTO `+c.table("inventory", "stock_ledger")+` (saga_id, sku, kind, qty) SELECT saga_id, sku, kind, qty FROM `+
		c.table("inventory", "stock_ledger")+` WHERE saga_id = $1`, completed)
	// A command whose inbox mark is gone: lost on the way.
	exec(`DELETE FROM ` + c.mtable("payment", "processed_event") + ` WHERE event_id = (SELECT event_id FROM ` + c.mtable("payment", "processed_event") + ` LIMIT 1)`)
	// A saga left stuck.
	exec(`UPDATE `+c.mtable("orders", "saga_instance")+` SET status = 'stuck' WHERE id = $1`, completed)
	// Another completed order whose shipping child saga says compensated
	// (the stuck one's child, completed, does not match it either: 2).
	exec(`UPDATE `+c.mtable("orders", "saga_instance")+` SET status = 'compensated' WHERE parent =
 (SELECT id FROM `+c.mtable("orders", "saga_instance")+` WHERE status = 'completed' AND parent = '' AND id <> $1 LIMIT 1)`, completed)
	r := count()
	if r.lost.total() != 1 || r.sagas.stuck != 1 || r.effects.stock < 1 || r.effects.balances < 1 || r.effects.orphans != 2 || r.ok() {
		t.Errorf("after planting damage: lost %d, stuck %d, effects %+v, ok %t; want 1 lost, 1 stuck, stock, balance and child saga mismatches, not ok",
			r.lost.total(), r.sagas.stuck, r.effects, r.ok())
	}
	var buf bytes.Buffer
	r.print(&buf)
	if !strings.Contains(buf.String(), "stuck=1 lost_events=1 double_effects=") || strings.HasSuffix(strings.TrimSpace(buf.String()), "double_effects=0") {
		t.Errorf("the demo line does not show the damage:\n%s", buf.String())
	}
}

// The four services as separate runs sharing only the database and the
// broker (the orders service's embedded broker on a port of its own), as
// with -service in four processes: the same counts hold.
func TestServicesRunSeparately(t *testing.T) {
	t.Parallel()
	if devkafka.EnvBrokers() == nil {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		t.Logf("embedded broker on port %d", port)
		testSeparately(t, port)
		return
	}
	testSeparately(t, 0)
}

func testSeparately(t *testing.T, port int) {
	log, out := &syncBuffer{}, &syncBuffer{}
	base := config{
		DatabaseURL: pgtest.URL(),
		Brokers:     devkafka.EnvBrokers(),
		Name:        "ordersaga_sep_" + randomHex(4),
		Sagas:       36,
		Seed:        3,
		Writers:     4,
		Conns:       3, // the whole suite shares PostgreSQL's max_connections
		Rate:        30,
		Faults:      true,
		Timeout:     90 * time.Second,
		BrokerPort:  port,
		Log:         log,
		Out:         out,
	}
	ctx := context.Background()
	admin, err := pgtest.Connect(ctx, pgtest.URL(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, s := range (names{base.Name}).schemas() {
			_, _ = admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{s}.Sanitize()+` CASCADE`)
		}
		admin.Close()
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("progress:\n%s\nsummary:\n%s", log.String(), out.String())
		}
	})

	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, svc := range []string{"payment", "inventory", "shipping"} {
		cfg := base
		cfg.Service = svc
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- serveParticipant(pctx, cfg)
		}()
	}
	cfg := base
	cfg.Service = "orders"
	res, err := run(ctx, cfg)
	stop()
	wg.Wait()
	close(errs)
	for e := range errs {
		if e != nil {
			t.Errorf("participant: %v", e)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	res.print(out)
	if !res.ok() {
		t.Errorf("checks failed: %+v", res.checks)
	}
	if !strings.HasSuffix(strings.TrimSpace(out.String()), "stuck=0 lost_events=0 double_effects=0") {
		t.Errorf("last line: %q", lines(out.String()))
	}
	for _, s := range []string{"payment: schema", "inventory: schema", "shipping: schema", "waiting for the payment, inventory and shipping services"} {
		if !strings.Contains(log.String(), s) {
			t.Errorf("progress output lacks %q", s)
		}
	}
}

func lines(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}
