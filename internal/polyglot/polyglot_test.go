package polyglot_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

type order struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// sagas is how many orders the test places; every fourth one's stock step
// fails, so its charge (Python) and credit (Go) are compensated.
const sagas = 40

// A saga of three steps, credit (Go), charge (Python) and stock (Go), for
// 40 orders, with every third message of both relays published twice and
// the Python process killed (SIGKILL) and started again twice while the
// sagas run; and each order's OrderPlaced event, written with the saga's
// start by the Go service, consumed by the Python service through its
// inbox, which answers with a PaymentNoted event through its outbox,
// consumed by the Go service through its inbox. At the end every effect
// matches the outcome: 0 lost, 0 doubled.
func TestSagaThroughAPythonParticipant(t *testing.T) {
	t.Parallel()
	py := pythonVenv(t)
	brokers := kafkatest.Brokers(t)
	ctx := context.Background()
	orders := pgtest.NewWith(t, pgtest.Options{MaxConns: 16})
	payments := pgtest.NewWith(t, pgtest.Options{MaxConns: 4})
	ot := func(name string) string { return sqlident.Table(orders.Schema, name) }
	pt := func(name string) string { return sqlident.Table(payments.Schema, name) }
	exec1(t, orders.Pool, `CREATE TABLE `+ot("ledger")+` (saga_id text NOT NULL, step text NOT NULL, kind text NOT NULL, amount bigint NOT NULL);
CREATE TABLE `+ot("payment_noted")+` (event_id uuid NOT NULL, order_id text NOT NULL)`)
	exec1(t, payments.Pool, `CREATE TABLE `+pt("ledger")+` (saga_id text NOT NULL, kind text NOT NULL, amount bigint NOT NULL);
CREATE TABLE `+pt("order_seen")+` (event_id uuid NOT NULL, order_id text NOT NULL)`)
	var (
		creditTopic, chargeTopic, stockTopic = kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
		replyTopic                           = kafkatest.Topic()
		ordersEvents, paymentsEvents         = kafkatest.Topic(), kafkatest.Topic()
	)

	// The saga and the Go participants.
	def, err := saga.Define(saga.Spec[order]{
		Type: "order", Version: 1, ReplyTopic: replyTopic,
		Defaults: saga.StepDefaults{Timeout: 20 * time.Second},
		Steps: []saga.Step[order]{
			{Name: "credit", Kind: saga.Compensatable,
				Action: &saga.Command[order]{Topic: creditTopic, Name: "reserve_credit"}, Compensation: &saga.Command[order]{}},
			{Name: "charge", Kind: saga.Compensatable,
				Action: &saga.Command[order]{Topic: chargeTopic, Name: "charge"}, Compensation: &saga.Command[order]{}},
			{Name: "stock", Kind: saga.Compensatable,
				Action: &saga.Command[order]{Topic: stockTopic, Name: "reserve_stock"}, Compensation: &saga.Command[order]{}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The Go service, its relay publishing every third message twice.
	dupOrders := duplicating(t, brokers)
	svc, err := millrace.New(orders.Pool, millrace.Config{
		Name: "orders-" + orders.Schema, Schema: orders.Schema, Brokers: brokers, Publisher: dupOrders})
	if err != nil {
		t.Fatal(err)
	}
	orch := svc.Orchestrator()
	if err := orch.Register(def); err != nil {
		t.Fatal(err)
	}
	goParticipant(t, svc, orders, "credit", creditTopic, "reserve_credit", func(o order) error { return nil })
	goParticipant(t, svc, orders, "stock", stockTopic, "reserve_stock", func(o order) error {
		if o.Amount%4 == 0 {
			return compensation.Fail("out of stock")
		}
		return nil
	})
	background(t, svc.Run)

	// The Go service's inbox of the Python service's events.
	notedInbox(t, orders, brokers, paymentsEvents)

	// The relay of the Python service's outbox (its replies and events):
	// millrace's Go relay, duplicating too.
	dupPayments := duplicating(t, brokers)
	relay, err := outbox.NewRelay(payments.Pool, outbox.RelayConfig{Schema: payments.Schema, Publisher: dupPayments})
	if err != nil {
		t.Fatal(err)
	}
	background(t, relay.Run)

	// The Python service.
	proc := &pyProcess{t: t, python: py, env: []string{
		"DATABASE_URL=" + pgtest.URL(), "KAFKA_BROKERS=" + strings.Join(brokers, ","), "SCHEMA=" + payments.Schema,
		"COMMANDS_TOPIC=" + chargeTopic, "ORDERS_EVENTS_TOPIC=" + ordersEvents, "PAYMENTS_EVENTS_TOPIC=" + paymentsEvents,
	}}
	proc.start()
	t.Cleanup(proc.stop)

	// The orders: each saga starts with its OrderPlaced event, in one
	// transaction.
	w, err := outbox.NewWriter(orders.Pool, outbox.WriterConfig{Schema: orders.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := range sagas {
		o := order{ID: fmt.Sprintf("order-%02d", i+1), Amount: int64(i + 1)}
		err := pgx.BeginFunc(ctx, orders.Pool, func(tx pgx.Tx) error {
			if _, err := saga.StartTx(ctx, tx, orch, def, o.ID, o); err != nil {
				return err
			}
			_, err := w.WriteTx(ctx, tx, outbox.Event{Topic: ordersEvents, PartitionKey: o.ID, EventType: "OrderPlaced",
				Payload: []byte(fmt.Sprintf(`{"id":%q}`, o.ID))})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// The faults: the Python process killed twice while sagas run.
	count := func(pool *pgxpool.Pool, sql string) int {
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, at := range []int{sagas / 4, sagas / 2} {
		waitFor(t, 2*time.Minute, fmt.Sprintf("%d charges", at), func() bool {
			return count(payments.Pool, `SELECT count(*) FROM `+pt("ledger")) >= at
		})
		proc.kill()
		proc.start()
	}

	// Every saga ends, every event arrives.
	ended := `SELECT count(*) FROM ` + ot("saga_instance") + ` WHERE status IN ('completed', 'compensated')`
	waitFor(t, 3*time.Minute, "every saga to end", func() bool { return count(orders.Pool, ended) == sagas })
	waitFor(t, 2*time.Minute, "every OrderPlaced at the Python inbox", func() bool {
		return count(payments.Pool, `SELECT count(*) FROM `+pt("order_seen")) >= sagas
	})
	waitFor(t, 2*time.Minute, "every PaymentNoted at the Go inbox", func() bool {
		return count(orders.Pool, `SELECT count(*) FROM `+ot("payment_noted")) >= sagas
	})

	// The outcome of each saga and the effects it left.
	rows, err := orders.Pool.Query(ctx, `SELECT id, status FROM `+ot("saga_instance"))
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	var id, st string
	if _, err := pgx.ForEachRow(rows, []any{&id, &st}, func() error { status[id] = st; return nil }); err != nil {
		t.Fatal(err)
	}
	effects := func(pool *pgxpool.Pool, sql string) map[string]int {
		rows, err := pool.Query(ctx, sql)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		var k string
		if _, err := pgx.ForEachRow(rows, []any{&k}, func() error { out[k]++; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	goEffects := effects(orders.Pool, `SELECT saga_id || '/' || step || '/' || kind || '/' || amount FROM `+ot("ledger"))
	pyEffects := effects(payments.Pool, `SELECT saga_id || '/' || kind || '/' || amount FROM `+pt("ledger"))
	compensated, lost, doubled := 0, 0, 0
	for i := range sagas {
		o := order{ID: fmt.Sprintf("order-%02d", i+1), Amount: int64(i + 1)}
		fails := o.Amount%4 == 0
		want := "completed"
		if fails {
			want, compensated = "compensated", compensated+1
		}
		if status[o.ID] != want {
			t.Errorf("saga %s is %s, want %s", o.ID, status[o.ID], want)
		}
		expect := func(got map[string]int, key string, n int) {
			switch c := got[key]; {
			case c < n:
				lost++
				t.Errorf("%s: %d, want %d (lost)", key, c, n)
			case c > n:
				doubled++
				t.Errorf("%s: %d, want %d (doubled)", key, c, n)
			}
			delete(got, key)
		}
		a := o.Amount
		expect(goEffects, fmt.Sprintf("%s/credit/action/%d", o.ID, a), 1)
		expect(pyEffects, fmt.Sprintf("%s/charge/%d", o.ID, a), 1)
		if fails {
			expect(goEffects, fmt.Sprintf("%s/credit/compensation/%d", o.ID, a), 1)
			expect(pyEffects, fmt.Sprintf("%s/refund/%d", o.ID, a), 1)
		} else {
			expect(goEffects, fmt.Sprintf("%s/stock/action/%d", o.ID, a), 1)
		}
	}
	for k, n := range goEffects {
		doubled += n
		t.Errorf("an effect no saga's outcome calls for: %s x%d", k, n)
	}
	for k, n := range pyEffects {
		doubled += n
		t.Errorf("an effect no saga's outcome calls for: %s x%d", k, n)
	}
	for _, c := range []struct {
		pool      *pgxpool.Pool
		table     string
		direction string
	}{{payments.Pool, pt("order_seen"), "Go outbox → Python inbox"}, {orders.Pool, ot("payment_noted"), "Python outbox → Go inbox"}} {
		var rowsN, distinct int
		if err := c.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT order_id) FROM `+c.table).Scan(&rowsN, &distinct); err != nil {
			t.Fatal(err)
		}
		if rowsN != sagas || distinct != sagas {
			t.Errorf("%s: %d events applied, %d distinct orders, want %d and %d", c.direction, rowsN, distinct, sagas, sagas)
			lost, doubled = lost+max(0, sagas-distinct), doubled+max(0, rowsN-distinct)
		}
	}
	if dupOrders.dups.Load() == 0 || dupPayments.dups.Load() == 0 || proc.kills != 2 {
		t.Errorf("the faults did not all happen: %d and %d duplicates published, %d kills", dupOrders.dups.Load(), dupPayments.dups.Load(), proc.kills)
	}
	t.Logf("%d sagas (%d compensated) through a Python participant; %d+%d duplicate messages, the Python process killed %d times; %d events each way; %d lost, %d doubled",
		sagas, compensated, dupOrders.dups.Load(), dupPayments.dups.Load(), proc.kills, sagas, lost, doubled)
	if t.Failed() {
		proc.dump()
	}
}

// goParticipant is a Go participant in db's schema whose action and
// compensation write a ledger row (fail says whether the action fails).
func goParticipant(t *testing.T, svc *millrace.Service, db *pgtest.DB, step, topic, command string, fail func(order) error) {
	p, err := svc.AddParticipant(step+"-"+db.Schema, topic)
	if err != nil {
		t.Fatal(err)
	}
	ledger := sqlident.Table(db.Schema, "ledger")
	write := func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+ledger+` (saga_id, step, kind, amount) VALUES ($1, $2, $3, $4)`,
			call.SagaID, step, call.Operation, o.Amount)
		return err
	}
	err = compensation.Register(p, command,
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) (struct{}, error) {
			if err := fail(o); err != nil {
				return struct{}{}, err
			}
			return struct{}{}, write(ctx, tx, call, o)
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) error {
			return write(ctx, tx, call, o)
		})
	if err != nil {
		t.Fatal(err)
	}
}

// notedInbox consumes topic into db's payment_noted, behind the inbox's
// dedup middleware.
func notedInbox(t *testing.T, db *pgtest.DB, brokers []string, topic string) {
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Group()}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	dedup, err := inbox.NewDeduplicator(db.Pool, inbox.DedupConfig{Schema: db.Schema, Consumer: "orders-payments"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	table := sqlident.Table(db.Schema, "payment_noted")
	h := r.AddConsumerHandler("noted", topic, sub, func(msg *message.Message) error {
		tx, _ := core.TxFromContext(msg.Context())
		var ev struct {
			Order string `json:"order"`
		}
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return core.Permanent(err)
		}
		_, err := tx.Exec(msg.Context(), `INSERT INTO `+table+` (event_id, order_id) VALUES ($1, $2)`,
			msg.Metadata.Get(core.MetadataEventID), ev.Order)
		return err
	})
	h.AddMiddleware(dedup.Middleware)
	background(t, func(ctx context.Context) error { return r.Run(ctx) })
	select {
	case <-r.Running():
	case <-time.After(time.Minute):
		t.Fatal("router did not start")
	}
	t.Cleanup(func() { _ = sub.Close() })
}

// dupPublisher publishes every third message twice (the same event id),
// as a relay that crashed between the broker's ack and marking its batch.
type dupPublisher struct {
	*kafka.Publisher
	n, dups atomic.Int64
}

func duplicating(t *testing.T, brokers []string) *dupPublisher {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return &dupPublisher{Publisher: pub}
}

func (p *dupPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	var again []*message.Message
	for _, m := range msgs {
		if p.n.Add(1)%3 == 0 {
			again = append(again, m.Copy())
		}
	}
	if len(again) > 0 && p.Publisher.Publish(topic, again...) == nil {
		p.dups.Add(int64(len(again)))
	}
	return nil
}

// pyProcess is the Python service's process.
type pyProcess struct {
	t      *testing.T
	python string
	env    []string

	mu    sync.Mutex
	cmd   *exec.Cmd
	out   bytes.Buffer
	kills int
}

func (p *pyProcess) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	root := repoRoot(p.t)
	cmd := exec.Command(p.python, "payments.py")
	cmd.Env = append(append(os.Environ(), p.env...), "PYTHONPATH="+filepath.Join(root, "python"))
	cmd.Stdout, cmd.Stderr = &lockedWriter{p}, &lockedWriter{p}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.cmd = cmd
}

// kill ends the process with SIGKILL: no cleanup, mid-transaction.
func (p *pyProcess) kill() {
	p.mu.Lock()
	cmd := p.cmd
	p.kills++
	p.mu.Unlock()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

func (p *pyProcess) stop() {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (p *pyProcess) dump() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.t.Logf("payments.py output:\n%s", p.out.String())
}

type lockedWriter struct{ p *pyProcess }

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	defer w.p.mu.Unlock()
	return w.p.out.Write(b)
}

// pythonVenv returns the python of the virtual environment
// scripts/python-venv.sh makes (once; later runs reuse it).
func pythonVenv(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "python-venv.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/python-venv.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no repository root at %s: %v", dir, err)
	}
	return dir
}

func background(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("run: %v", err)
		}
	})
}

func exec1(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
