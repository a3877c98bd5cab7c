package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// counter counts from the databases: every figure the checks use is read
// from the services' schemas, never from counters in memory.
type counter struct {
	admin *pgxpool.Pool // no search_path: every name is schema-qualified
	n     names
}

// table is a service's own table; mtable one of millrace's tables of the
// service.
func (c *counter) table(service, table string) string {
	return pgx.Identifier{c.n.schema(service), table}.Sanitize()
}

func (c *counter) mtable(service, table string) string {
	return pgx.Identifier{c.n.millrace(service), table}.Sanitize()
}

// sagaCounts are the sagas by status, from saga_instance.
type sagaCounts struct {
	total, running, compensating, completed, compensated, stuck int64
}

func (s sagaCounts) ended() int64    { return s.completed + s.compensated }
func (s sagaCounts) inFlight() int64 { return s.running + s.compensating + s.stuck }

func (c *counter) sagas(ctx context.Context) (sagaCounts, error) {
	var s sagaCounts
	err := c.admin.QueryRow(ctx, `SELECT count(*),
       count(*) FILTER (WHERE status = 'running'),
       count(*) FILTER (WHERE status = 'compensating'),
       count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status = 'compensated'),
       count(*) FILTER (WHERE status = 'stuck')
  FROM `+c.mtable("orders", "saga_instance")+` WHERE parent = ''`).Scan(&s.total, &s.running, &s.compensating, &s.completed, &s.compensated, &s.stuck)
	return s, err
}

// pending counts the events still waiting in the four outboxes.
func (c *counter) pending(ctx context.Context) (int64, error) {
	var parts []string
	for _, s := range services {
		parts = append(parts, "(SELECT count(*) FROM "+c.mtable(s, "outbox_pending")+")")
	}
	var n int64
	err := c.admin.QueryRow(ctx, `SELECT `+strings.Join(parts, " + ")).Scan(&n)
	return n, err
}

var services = []string{"orders", "payment", "inventory", "shipping"}

// route is where the events of a topic are consumed: the consumer's schema
// and its inbox consumer name.
type route struct {
	topic, service, consumer string
}

func (c *counter) routes() []route {
	return []route{
		{c.n.commands("payment"), "payment", "payment"},
		{c.n.commands("inventory"), "inventory", "inventory"},
		{c.n.commands("shipping"), "shipping", "shipping"},
		{c.n.replies(), "orders", sagaConsumer},
	}
}

// lostCounts are, per producing service, its outbox events and those with
// no inbox mark (processed_event) at their consumer.
type lostCounts struct {
	events, lost map[string]int64
}

func (l lostCounts) total() (n int64) {
	for _, v := range l.lost {
		n += v
	}
	return n
}

func (c *counter) lost(ctx context.Context) (lostCounts, error) {
	l := lostCounts{events: map[string]int64{}, lost: map[string]int64{}}
	routes := c.routes()
	var topics []string
	for _, r := range routes {
		topics = append(topics, r.topic)
	}
	for _, producer := range services {
		for _, r := range routes {
			var events, lost int64
			err := c.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE p.event_id IS NULL)
  FROM `+c.mtable(producer, "outbox_event")+` e
  LEFT JOIN `+c.mtable(r.service, "processed_event")+` p ON p.consumer = $2 AND p.event_id = e.event_id
 WHERE e.topic = $1`, r.topic, r.consumer).Scan(&events, &lost)
			if err != nil {
				return l, err
			}
			l.events[producer] += events
			l.lost[producer] += lost
		}
		// An event for a topic nobody consumes is lost too.
		var stray int64
		if err := c.admin.QueryRow(ctx, `SELECT count(*) FROM `+c.mtable(producer, "outbox_event")+` WHERE topic <> ALL($1)`,
			topics).Scan(&stray); err != nil {
			return l, err
		}
		l.events[producer] += stray
		l.lost[producer] += stray
	}
	return l, nil
}

// effects are the participants' effects, and how many do not match their
// saga's outcome one to one.
type effects struct {
	reserved, released, taken, returned, shipments int64
	// children is the shipping child sagas completed.
	children int64
	// Mismatches, by kind: per saga (credit, stock, shipment, order row,
	// a child saga that did not end as its order saga did) and per balance
	// (an account or a SKU whose balance is not its starting value minus
	// its ledger).
	credit, stock, shipping, orders, orphans, balances int64
}

func (e effects) double() int64 {
	return e.credit + e.stock + e.shipping + e.orders + e.orphans + e.balances
}

func (c *counter) effects(ctx context.Context) (effects, error) {
	var e effects
	// The order sagas, not their shipping child sagas.
	sagas := "(SELECT * FROM " + c.mtable("orders", "saga_instance") + " WHERE parent = '')"
	if err := c.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE c.status = 'completed'), count(*) FILTER (WHERE p.status <> c.status)
  FROM `+c.mtable("orders", "saga_instance")+` c JOIN `+sagas+` p ON p.id = c.parent`).Scan(&e.children, &e.orphans); err != nil {
		return e, err
	}
	// A ledger of reserve/release (take/return) rows per saga must read:
	// completed, one reserve and no release; compensated, as many releases
	// as reserves, at most one; otherwise at most one of each. A ledger row
	// of a saga that does not exist counts too.
	ledger := func(table, do, undo string) (int64, int64, int64, error) {
		var bad, dos, undos int64
		err := c.admin.QueryRow(ctx, fmt.Sprintf(`
WITH l AS (
    SELECT saga_id, count(*) FILTER (WHERE kind = '%[2]s') AS d, count(*) FILTER (WHERE kind = '%[3]s') AS u
      FROM %[1]s GROUP BY saga_id
)
SELECT count(*) FILTER (WHERE s.id IS NULL
                           OR coalesce(l.d, 0) > 1 OR coalesce(l.u, 0) > coalesce(l.d, 0)
                           OR (s.status = 'completed' AND (coalesce(l.d, 0) <> 1 OR coalesce(l.u, 0) <> 0))
                           OR (s.status = 'compensated' AND coalesce(l.d, 0) <> coalesce(l.u, 0))),
       coalesce(sum(l.d), 0), coalesce(sum(l.u), 0)
  FROM %[4]s s FULL JOIN l ON l.saga_id = s.id`, table, do, undo, sagas)).Scan(&bad, &dos, &undos)
		return bad, dos, undos, err
	}
	var err error
	if e.credit, e.reserved, e.released, err = ledger(c.table("payment", "credit_ledger"), "reserve", "release"); err != nil {
		return e, err
	}
	if e.stock, e.taken, e.returned, err = ledger(c.table("inventory", "stock_ledger"), "take", "return"); err != nil {
		return e, err
	}
	// One shipment per completed saga, none for a compensated one.
	err = c.admin.QueryRow(ctx, `
WITH sh AS (SELECT order_id AS saga_id, count(*) AS n FROM `+c.table("shipping", "shipment")+` GROUP BY order_id)
SELECT count(*) FILTER (WHERE s.id IS NULL OR coalesce(sh.n, 0) > 1
                           OR (s.status = 'completed' AND coalesce(sh.n, 0) <> 1)
                           OR (s.status = 'compensated' AND coalesce(sh.n, 0) <> 0)),
       coalesce(sum(sh.n), 0)
  FROM `+sagas+` s FULL JOIN sh ON sh.saga_id = s.id`).Scan(&e.shipping, &e.shipments)
	if err != nil {
		return e, err
	}
	// Each order has one saga: shipped when it completed, cancelled when it
	// was compensated.
	err = c.admin.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE s.id IS NULL OR o.id IS NULL
                           OR (s.status = 'completed' AND o.status <> 'shipped')
                           OR (s.status = 'compensated' AND o.status <> 'cancelled'))
  FROM `+sagas+` s FULL JOIN `+c.table("orders", "orders")+` o ON o.id = s.id`).Scan(&e.orders)
	if err != nil {
		return e, err
	}
	// Balances against ledgers.
	err = c.admin.QueryRow(ctx, `
SELECT (SELECT count(*) FROM `+c.table("payment", "account")+` a
          LEFT JOIN (SELECT customer, sum(CASE kind WHEN 'reserve' THEN amount ELSE -amount END) AS net
                       FROM `+c.table("payment", "credit_ledger")+` GROUP BY customer) l USING (customer)
         WHERE a.available <> a.credit_limit - coalesce(l.net, 0))
     + (SELECT count(*) FROM `+c.table("inventory", "stock")+` k
          LEFT JOIN (SELECT sku, sum(CASE kind WHEN 'take' THEN qty ELSE -qty END) AS net
                       FROM `+c.table("inventory", "stock_ledger")+` GROUP BY sku) l USING (sku)
         WHERE k.on_hand <> k.initial - coalesce(l.net, 0))`).Scan(&e.balances)
	return e, err
}

// history counts what the saga history shows of the faults.
type history struct {
	timeouts, fenced, compFailures, stuck, operator int64
}

func (c *counter) history(ctx context.Context) (history, error) {
	var h history
	err := c.admin.QueryRow(ctx, `SELECT
       count(*) FILTER (WHERE event = 'timeout'),
       count(*) FILTER (WHERE event = 'fenced'),
       -- A failed compensation's reply that came after its attempt timed out is
       -- recorded as fenced: it still shows the injected failure.
       count(*) FILTER (WHERE event IN ('reply', 'fenced') AND operation = 'compensation' AND outcome = 'failure'),
       count(*) FILTER (WHERE event = 'stuck'),
       count(*) FILTER (WHERE event = 'operator')
  FROM `+c.mtable("orders", "saga_history")).Scan(&h.timeouts, &h.fenced, &h.compFailures, &h.stuck, &h.operator)
	return h, err
}

// marks counts the inbox marks of every service.
func (c *counter) marks(ctx context.Context) (int64, error) {
	var parts []string
	for _, s := range services {
		parts = append(parts, "(SELECT count(*) FROM "+c.mtable(s, "processed_event")+")")
	}
	var n int64
	err := c.admin.QueryRow(ctx, `SELECT `+strings.Join(parts, " + ")).Scan(&n)
	return n, err
}

// waits counts the sagas waiting for their payment confirmation (the
// wait step) and the confirmations that arrived before their saga waited
// for them (history lines "event" with outcome "pending").
func (c *counter) waits(ctx context.Context) (waiting, early int64, err error) {
	err = c.admin.QueryRow(ctx, `SELECT
       (SELECT count(*) FROM `+c.mtable("orders", "saga_instance")+` WHERE status = 'running' AND step = 'payment_confirmed'),
       (SELECT count(*) FROM `+c.mtable("orders", "saga_history")+` WHERE event = 'event' AND outcome = 'pending')`).Scan(&waiting, &early)
	return waiting, early, err
}

// progress prints a line every second: sagas started, completed,
// compensated and in flight (from saga_instance), the sagas waiting for
// their payment confirmation and the confirmations that came early.
type progress struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func startProgress(ctx context.Context, lg *logger, c *counter, orders *ordersService) *progress {
	ctx, cancel := context.WithCancel(ctx)
	p := &progress{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s, err := c.sagas(ctx)
			if err != nil {
				continue
			}
			pending, _ := c.pending(ctx)
			waiting, early, _ := c.waits(ctx)
			lg.say("sagas started %5d  completed %5d  compensated %5d  in flight %4d (stuck %d, waiting for payment_confirmed %d; confirmations early %d)  outbox pending %4d",
				s.total, s.completed, s.compensated, s.inFlight(), s.stuck, waiting, early, pending)
		}
	}()
	return p
}

func (p *progress) stop() {
	p.once.Do(func() {
		p.cancel()
		<-p.done
	})
}

// result is what a run saw, and its checks.
type result struct {
	cfg   config
	kafka string

	sagas   sagaCounts
	lost    lostCounts
	effects effects
	history history
	marks   int64

	// From memory, for the story (no check relies on them alone).
	deliveries, duplicatesSent, carrierFailures int64
	operatorFixed, operatorUnknown              int64
	confirmations, lateConfirmations            int64 // payment webhooks taken, and refused (saga ended)
	earlyConfirmations                          int64 // from the history: arrived before the saga waited
	restarted                                   bool

	elapsed time.Duration
	waitErr error
	checks  []check
}

type check struct {
	name   string
	ok     bool
	detail string
}

func (r *result) collect(ctx context.Context, c *counter) error {
	var err error
	if r.sagas, err = c.sagas(ctx); err != nil {
		return err
	}
	if r.lost, err = c.lost(ctx); err != nil {
		return err
	}
	if r.effects, err = c.effects(ctx); err != nil {
		return err
	}
	if r.history, err = c.history(ctx); err != nil {
		return err
	}
	if r.marks, err = c.marks(ctx); err != nil {
		return err
	}
	if _, r.earlyConfirmations, err = c.waits(ctx); err != nil {
		return err
	}
	r.evaluate()
	return nil
}

// evaluate runs the checks on the counts.
func (r *result) evaluate() {
	r.checks = nil
	add := func(name string, ok bool, format string, args ...any) {
		r.checks = append(r.checks, check{name: name, ok: ok, detail: fmt.Sprintf(format, args...)})
	}
	s := r.sagas
	add("every order has a saga", s.total == int64(r.cfg.Sagas), "%d sagas for %d orders", s.total, r.cfg.Sagas)
	add("every saga ended", s.ended() == s.total && s.total > 0,
		"%d completed + %d compensated of %d (running %d, compensating %d, stuck %d)", s.completed, s.compensated, s.total, s.running, s.compensating, s.stuck)
	add("nothing stuck", s.stuck == 0, "%d stuck", s.stuck)
	add("no event lost", r.lost.total() == 0, "%d of %d outbox events have no inbox mark at their consumer", r.lost.total(), r.lost.eventsTotal())
	e := r.effects
	add("effects match outcomes one to one", e.double() == 0,
		"mismatches: credit %d, stock %d, shipments %d, orders %d, child sagas %d, balances %d", e.credit, e.stock, e.shipping, e.orders, e.orphans, e.balances)
	add("both outcomes seen", s.completed > 0 && s.compensated > 0, "%d completed, %d compensated", s.completed, s.compensated)
	if r.waitErr != nil {
		add("finished in time", false, "%v", r.waitErr)
	}
	if r.cfg.Faults {
		h := r.history
		add("faults injected and survived",
			r.duplicatesSent > 0 && (r.cfg.Service != "all" || r.deliveries > r.marks) && h.timeouts > 0 && h.fenced > 0 && r.restarted &&
				h.compFailures >= 2+int64(undoAttempts) && h.stuck > 0 && h.operator > 0 && r.operatorFixed == 1,
			"duplicates sent %d (deliveries %d, inbox marks %d), step timeouts %d, fenced replies %d, orchestrator restarted %t, failed compensation replies %d, stuck %d then fixed by %d operator action(s)",
			r.duplicatesSent, r.deliveries, r.marks, h.timeouts, h.fenced, r.restarted, h.compFailures, h.stuck, h.operator)
	}
}

// undoAttempts is the compensation retry budget of the order saga's remote
// steps (CompensationRetry.MaxAttempts): the held refund fails that often
// before the saga is stuck.
const undoAttempts = 4

func (l lostCounts) eventsTotal() (n int64) {
	for _, v := range l.events {
		n += v
	}
	return n
}

func (r *result) ok() bool {
	for _, c := range r.checks {
		if !c.ok {
			return false
		}
	}
	return len(r.checks) > 0
}

// print writes the summary table, the checks and the last line.
func (r *result) print(w io.Writer) {
	s, e, h := r.sagas, r.effects, r.history
	rate := 0.0
	if r.elapsed > 0 {
		rate = float64(s.ended()) / r.elapsed.Seconds()
	}
	fmt.Fprintf(w, "\norder saga: %d sagas in %.1fs (%.0f/s end to end), 4 services, Kafka: %s, faults %s\n\n",
		s.total, r.elapsed.Seconds(), rate, r.kafka, onOff(r.cfg.Faults))
	row := func(what, figures string) { fmt.Fprintf(w, "  %-11s %s\n", what, figures) }
	row("sagas", fmt.Sprintf("completed %d, compensated %d, stuck %d, running %d, compensating %d", s.completed, s.compensated, s.stuck, s.running, s.compensating))
	row("payment", fmt.Sprintf("credit reserved %d times, released %d times", e.reserved, e.released))
	row("inventory", fmt.Sprintf("stock taken %d times, returned %d times", e.taken, e.returned))
	row("shipping", fmt.Sprintf("%d shipments booked by %d shipping child sagas (carrier failures retried: %d)", e.shipments, e.children, r.carrierFailures))
	row("webhooks", fmt.Sprintf("%d payment confirmations taken (%d before their saga waited for them, at payment_confirmed), %d refused: the saga had ended (no running saga held the payment id)",
		r.confirmations, r.earlyConfirmations, r.lateConfirmations))
	row("messages", fmt.Sprintf("%d outbox events, %d deliveries (%d duplicates injected), %d inbox marks, %d lost",
		r.lost.eventsTotal(), r.deliveries, r.duplicatesSent, r.marks, r.lost.total()))
	for _, svc := range services {
		row("", fmt.Sprintf("  %-9s %5d events, %d without an inbox mark at their consumer", svc, r.lost.events[svc], r.lost.lost[svc]))
	}
	row("history", fmt.Sprintf("%d step timeouts, %d fenced replies, %d failed compensation replies, %d stuck, %d operator actions",
		h.timeouts, h.fenced, h.compFailures, h.stuck, h.operator))
	fmt.Fprintln(w)
	for _, c := range r.checks {
		mark := "ok  "
		if !c.ok {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-36s %s\n", mark, c.name, c.detail)
	}
	fmt.Fprintf(w, "\ndemo: sagas=%d completed=%d compensated=%d stuck=%d lost_events=%d double_effects=%d\n",
		s.total, s.completed, s.compensated, s.stuck, r.lost.total(), e.double())
}
