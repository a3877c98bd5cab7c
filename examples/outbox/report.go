package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress prints a line to the log every 500 ms: orders committed, the
// outbox backlog (outbox.Admin.Stats), what each relay published and what
// billing applied.
type progress struct {
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func startProgress(e *env, w io.Writer, orders *ordersService, b *billing, relays ...*relay) *progress {
	ctx, cancel := context.WithCancel(context.Background())
	p := &progress{cancel: cancel, done: make(chan struct{})}
	start := time.Now()
	go func() {
		defer close(p.done)
		if w == io.Discard {
			return
		}
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			st, err := e.admin.Stats(ctx)
			if err != nil {
				continue
			}
			applied, err := b.applied(ctx)
			if err != nil {
				continue
			}
			var published int64
			var per []string
			for _, r := range relays {
				published += r.published()
				per = append(per, fmt.Sprintf("%s %d", r.name, r.published()))
			}
			committed, _ := orders.counts()
			fmt.Fprintf(w, "  %5.1fs  orders %6d  outbox pending %5d  published %6d (%s)  billed %6d\n",
				time.Since(start).Seconds(), committed, st.Pending, published, strings.Join(per, ", "), applied)
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

// summary is what a run saw, and the checks.
type summary struct {
	cfg    config
	schema string
	kafka  string

	firstHalfCommitted int64 // orders committed before relay-a stopped
	committed          int64
	rejected           []int64

	orderEvents, orderEventsPublished                 int64
	invoices, invoicesDistinct, invoicesPublished     int64
	relayAPublished, relayBPublished, relayBAfterStop int64
	pendingAtEnd                                      int64

	delivered, distinctDelivered int64    // deliveries to billing, distinct orders among them
	applied                      int64    // rows in processed_event
	outOfOrder                   []string // orders that reached billing before an earlier one of their customer

	// Traces of the rolled-back orders: order rows, outbox events, deliveries.
	rejectedRows, rejectedEvents, rejectedDelivered int64

	replay           replayResult
	replayDelivered  int64 // deliveries of the replayed customer's orders, both rounds
	balanceAfter     int64
	billedAfter      int64
	billedTotalCents int64
	orderTotalCents  int64
	wrongBalances    int64 // customers whose balance differs from their orders' sum

	billedAt, elapsed time.Duration
	waitErr           error
	checks            []check
}

// check is one guarantee the demo verified.
type check struct {
	Name   string
	OK     bool
	Detail string
}

// collect reads the final state from the database and the delivery log,
// then runs the checks.
func (s *summary) collect(ctx context.Context, e *env, orders *ordersService, b *billing) error {
	s.committed, s.rejected = orders.counts()
	s.delivered, s.distinctDelivered, s.rejectedDelivered, s.outOfOrder = b.deliveries.snapshot(s.rejected)
	_, _, s.replayDelivered, _ = b.deliveries.snapshot(s.replay.orderIDs)

	var err error
	if s.applied, err = b.applied(ctx); err != nil {
		return err
	}
	st, err := e.admin.Stats(ctx)
	if err != nil {
		return err
	}
	s.pendingAtEnd = st.Pending + st.Dead

	// What the outbox log holds. (The log is millrace's table
	// outbox_event; reading it directly is fine for a report.)
	err = e.pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE event_type = 'OrderPlaced'),
       count(*) FILTER (WHERE event_type = 'OrderPlaced' AND published_at IS NOT NULL),
       count(*) FILTER (WHERE event_type = 'InvoiceIssued'),
       count(DISTINCT aggregate_id) FILTER (WHERE event_type = 'InvoiceIssued'),
       count(*) FILTER (WHERE event_type = 'InvoiceIssued' AND published_at IS NOT NULL)
  FROM outbox_event`).Scan(&s.orderEvents, &s.orderEventsPublished, &s.invoices, &s.invoicesDistinct, &s.invoicesPublished)
	if err != nil {
		return err
	}

	// Billing's balances against the orders that committed, per customer.
	err = e.pool.QueryRow(ctx, `
WITH placed AS (
    SELECT customer_id, sum(amount_cents) AS total, count(*) AS n FROM orders GROUP BY customer_id
)
SELECT count(*) FILTER (WHERE b.balance_cents <> coalesce(p.total, 0) OR b.orders_billed <> coalesce(p.n, 0)),
       coalesce(sum(b.balance_cents), 0)::bigint,
       coalesce(sum(p.total), 0)::bigint
  FROM customer_balance b LEFT JOIN placed p USING (customer_id)`).Scan(&s.wrongBalances, &s.billedTotalCents, &s.orderTotalCents)
	if err != nil {
		return err
	}

	// Traces of the rolled-back orders: rows, events of any kind.
	ids := make([]string, len(s.rejected))
	for i, id := range s.rejected {
		ids[i] = fmt.Sprint(id)
	}
	err = e.pool.QueryRow(ctx, `
SELECT (SELECT count(*) FROM orders WHERE id = ANY($1::bigint[])),
       (SELECT count(*) FROM outbox_event WHERE aggregate_id = ANY($2::text[]))`,
		s.rejected, ids).Scan(&s.rejectedRows, &s.rejectedEvents)
	if err != nil {
		return err
	}

	if s.replay.customer != "" {
		err = e.pool.QueryRow(ctx, `SELECT balance_cents, orders_billed FROM customer_balance WHERE customer_id = $1`,
			s.replay.customer).Scan(&s.balanceAfter, &s.billedAfter)
		if err != nil {
			return err
		}
	}

	s.evaluate()
	return nil
}

// evaluate runs the checks on what collect gathered.
func (s *summary) evaluate() {
	s.checks = nil
	if s.waitErr != nil {
		s.fail("the pipeline caught up", s.waitErr.Error())
	}
	s.verify("nothing lost",
		s.orderEvents == s.committed && s.orderEventsPublished == s.committed && s.applied == s.committed &&
			s.distinctDelivered == s.committed,
		"%d orders committed, %d OrderPlaced events written, %d published, %d delivered to billing, %d applied",
		s.committed, s.orderEvents, s.orderEventsPublished, s.distinctDelivered, s.applied)
	s.verify("every committed order billed exactly once",
		s.wrongBalances == 0 && s.billedTotalCents == s.orderTotalCents,
		"sum of balances %s, sum of committed orders %s; %d customer(s) whose balance or count differs from their orders",
		dollars(s.billedTotalCents), dollars(s.orderTotalCents), s.wrongBalances)
	s.verify("no rolled-back order billed", s.rejectedRows == 0 && s.rejectedEvents == 0 && s.rejectedDelivered == 0,
		"%d rolled back; of them %d order rows, %d outbox events, %d deliveries to billing",
		len(s.rejected), s.rejectedRows, s.rejectedEvents, s.rejectedDelivered)
	if len(s.outOfOrder) == 0 {
		s.verify("per-customer order preserved", true,
			"every customer's orders reached billing as #1, #2, #3, ... (no gap, no swap)")
	} else {
		s.verify("per-customer order preserved", false, "%d out of order, first: %s", len(s.outOfOrder), s.outOfOrder[0])
	}
	if s.replay.customer == "" {
		s.fail("the replay billed nothing twice", "not run, as billing did not catch up")
	} else {
		s.verify("the replay billed nothing twice",
			s.replay.events > 0 && s.replay.events == int64(len(s.replay.orderIDs)) &&
				s.replayDelivered >= 2*s.replay.events &&
				s.balanceAfter == s.replay.balanceBefore && s.billedAfter == s.replay.billedBefore,
			"%s's %d events replayed, %d deliveries in all; balance %s before, %s after",
			s.replay.customer, s.replay.events, s.replayDelivered, dollars(s.replay.balanceBefore), dollars(s.balanceAfter))
	}
	s.verify("one invoice per billed order",
		s.invoices == s.committed && s.invoicesDistinct == s.committed && s.invoicesPublished == s.invoices,
		"%d InvoiceIssued events for %d orders, %d published", s.invoices, s.invoicesDistinct, s.invoicesPublished)
	secondHalf := s.committed - s.firstHalfCommitted
	s.verify("relay-b took over relay-a's lanes",
		s.relayBAfterStop >= secondHalf && s.pendingAtEnd == 0,
		"after relay-a stopped, relay-b published %d events (%d orders placed since); %d left in the outbox",
		s.relayBAfterStop, secondHalf, s.pendingAtEnd)
}

func (s *summary) verify(name string, ok bool, format string, args ...any) {
	s.checks = append(s.checks, check{Name: name, OK: ok, Detail: name + ": " + fmt.Sprintf(format, args...)})
}

func (s *summary) fail(name, detail string) {
	s.checks = append(s.checks, check{Name: name, OK: false, Detail: name + ": " + detail})
}

// failed returns the checks that did not hold.
func (s *summary) failed() []check {
	var out []check
	for _, c := range s.checks {
		if !c.OK {
			out = append(out, c)
		}
	}
	return out
}

// print writes the summary table and the checks.
func (s *summary) print(w io.Writer) {
	published := s.relayAPublished + s.relayBPublished
	duplicates := s.delivered - s.applied
	row := func(label string, n int64, note string, args ...any) {
		fmt.Fprintf(w, "  %-22s %8d   %s\n", label, n, fmt.Sprintf(note, args...))
	}
	fmt.Fprintf(w, "\nmillrace demo: transactional outbox + inbox (PostgreSQL schema %s, Kafka: %s)\n\n", s.schema, s.kafka)
	row("orders committed", s.committed, "each with its OrderPlaced event, in one transaction")
	row("orders rolled back", int64(len(s.rejected)), "failed validation on purpose; their events vanished with them")
	row("events published", published, "OrderPlaced + InvoiceIssued + replayed; relay-a %d (then stopped), relay-b %d",
		s.relayAPublished, s.relayBPublished)
	row("delivered to billing", s.delivered, "incl. duplicates")
	row("applied once", s.applied, "rows in processed_event")
	if s.replay.customer != "" {
		row("duplicates skipped", duplicates, "%d replayed for %s, %d other redeliveries",
			s.replay.events, s.replay.customer, max(0, duplicates-s.replay.events))
	} else {
		row("duplicates skipped", duplicates, "no replay: billing did not catch up")
	}
	row("invoices emitted", s.invoices, "InvoiceIssued through billing's outbox, in its transactions")
	secs := s.elapsed.Seconds()
	fmt.Fprintf(w, "  %-22s %7.1fs   all billed after %.1fs; %.0f events/s published\n",
		"time", secs, s.billedAt.Seconds(), float64(published)/max(secs, 0.001))

	fmt.Fprintln(w, "\nchecks")
	for _, c := range s.checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s  %s\n", mark, c.Detail)
	}
	if len(s.failed()) == 0 {
		fmt.Fprintln(w, "\nall checks passed")
	}
}

// dollars formats cents as $1,234.56.
func dollars(cents int64) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	whole := fmt.Sprint(cents / 100)
	for i := len(whole) - 3; i > 0; i -= 3 {
		whole = whole[:i] + "," + whole[i:]
	}
	return fmt.Sprintf("%s$%s.%02d", sign, whole, cents%100)
}
