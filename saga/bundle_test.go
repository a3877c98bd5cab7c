package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// order is the test sagas' data.
type order struct {
	ID       string `json:"id"`
	Amount   int    `json:"amount"`
	Approved bool   `json:"approved"`
	CreditTx string `json:"credit_tx,omitempty"`
}

// testBundle is a schema, an orchestrator on it, a relay shipping the
// outbox through an in-process Watermill transport, and a router running
// the orchestrator's reply handler and the test participants.
type testBundle struct {
	t      testing.TB
	db     *pgtest.DB
	w      *outbox.Writer
	o      *saga.Orchestrator
	pubsub *gochannel.GoChannel
	router *message.Router
	clock  saga.Clock
	tbl    func(string) string
	// replyTopic is where participants reply (from the registered definition).
	replyTopic string
}

type bundleOptions struct {
	clock saga.Clock
	hook  saga.Hook
	// noTimers leaves the orchestrator's Run loop off (the test calls RunDue).
	noTimers bool
	poll     time.Duration
	metrics  *saga.Metrics
}

func setup(t testing.TB, opts bundleOptions) *testBundle {
	t.Helper()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 6})
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if opts.poll == 0 {
		opts.poll = 20 * time.Millisecond
	}
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema, Writer: w, Clock: opts.clock, Hook: opts.hook,
		PollInterval: opts.poll, Metrics: opts.metrics})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{t: t, db: db, w: w, o: o, clock: opts.clock,
		tbl:    func(name string) string { return sqlident.Table(db.Schema, name) },
		pubsub: gochannel.NewGoChannel(gochannel.Config{Persistent: true, OutputChannelBuffer: 1024}, watermill.NopLogger{}),
	}
	t.Cleanup(func() { b.pubsub.Close() })
	b.router = newRouter(t)
	_, err = db.Pool.Exec(context.Background(), fmt.Sprintf(`
CREATE TABLE %[1]s (saga_id text, step text, op text, outcome text, reason text, PRIMARY KEY (saga_id, step, op));
CREATE TABLE %[2]s (seq bigint GENERATED ALWAYS AS IDENTITY, saga_id text, step text, what text);`,
		b.tbl("test_barrier"), b.tbl("test_effect")))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run starts the router, the relay and (unless noTimers) the timers, and
// stops them when the test ends.
func (b *testBundle) run(opts bundleOptions, defs ...saga.Registrable) {
	t := b.t
	t.Helper()
	if err := b.o.Register(defs...); err != nil {
		t.Fatal(err)
	}
	for _, topic := range b.o.ReplyTopics() {
		b.replyTopic = topic
		h := b.router.AddNoPublisherHandler("orchestrator-"+topic, topic, b.pubsub, b.o.Handler())
		h.AddMiddleware(middleware.Retry{MaxRetries: 100, InitialInterval: time.Millisecond, MaxInterval: 50 * time.Millisecond, ShouldRetry: inbox.ShouldRetry}.Middleware)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := b.router.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	<-b.router.Running()
	relay, err := outbox.NewRelay(b.db.Pool, outbox.RelayConfig{Schema: b.db.Schema, Publisher: b.pubsub, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = relay.Run(ctx) }()
	if !opts.noTimers {
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.o.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		_ = b.router.Close()
		wg.Wait()
	})
}

// decision is what a test participant does with one delivery.
type decision string

const (
	succeed decision = "success"
	fail    decision = "failure"
	drop    decision = "drop" // a technical failure: no reply (the timeout resends)
)

// participant is a hand-written saga participant speaking the wire
// protocol: a barrier keyed by (saga, step, operation) in test_barrier, and
// its effects in test_effect ("do" on action, "undo" on compensation).
type participant struct {
	b      *testBundle
	step   string
	decide func(sagaID, op string, attempt int) decision
	runs   atomic.Int64 // times the action function ran
}

func (b *testBundle) participant(topic, step string, decide func(sagaID, op string, attempt int) decision) *participant {
	b.t.Helper()
	if decide == nil {
		decide = func(string, string, int) decision { return succeed }
	}
	p := &participant{b: b, step: step, decide: decide}
	dedup, err := inbox.NewDeduplicator(b.db.Pool, inbox.DedupConfig{Schema: b.db.Schema, Consumer: "participant-" + step})
	if err != nil {
		b.t.Fatal(err)
	}
	h := b.router.AddNoPublisherHandler("participant-"+step, topic, b.pubsub, func(msg *message.Message) error {
		_, err := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) { return nil, p.handle(msg) })(msg)
		return err
	})
	h.AddMiddleware(middleware.Retry{MaxRetries: 100, InitialInterval: time.Millisecond, MaxInterval: 50 * time.Millisecond}.Middleware)
	return p
}

func (p *participant) handle(msg *message.Message) error {
	ctx := msg.Context()
	tx, _ := millrace.TxFromContext(ctx)
	md := msg.Metadata
	id, op := md.Get(millrace.MetadataSagaID), md.Get(millrace.MetadataSagaOperation)
	attempt, _ := strconv.Atoi(md.Get(millrace.MetadataSagaAttempt))
	reply := func(outcome, reason string, payload []byte) error {
		if payload == nil {
			payload = []byte("{}")
		}
		_, err := p.b.w.WriteTx(ctx, tx, outbox.Event{Topic: md.Get(millrace.MetadataSagaReplyTopic), PartitionKey: id, Payload: payload,
			Metadata: map[string]string{
				millrace.MetadataSagaID: id, millrace.MetadataSagaType: md.Get(millrace.MetadataSagaType),
				millrace.MetadataSagaStep: p.step, millrace.MetadataSagaAttempt: md.Get(millrace.MetadataSagaAttempt),
				millrace.MetadataSagaOperation: op, millrace.MetadataSagaOutcome: outcome, millrace.MetadataSagaReason: reason,
			}})
		return err
	}
	barrier := func(o string) (outcome, reason string, found bool, err error) {
		err = tx.QueryRow(ctx, fmt.Sprintf(`SELECT outcome, reason FROM %s WHERE saga_id = $1 AND step = $2 AND op = $3`, p.b.tbl("test_barrier")),
			id, p.step, o).Scan(&outcome, &reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return "", "", false, nil
		}
		return outcome, reason, err == nil, err
	}
	record := func(o, outcome, reason string) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s VALUES ($1, $2, $3, $4, $5)`, p.b.tbl("test_barrier")), id, p.step, o, outcome, reason)
		return err
	}
	effect := func(what string) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (saga_id, step, what) VALUES ($1, $2, $3)`, p.b.tbl("test_effect")), id, p.step, what)
		return err
	}
	if outcome, reason, found, err := barrier(op); err != nil {
		return err
	} else if found {
		return reply(outcome, reason, nil) // a repeated attempt: the first outcome again
	}
	if op == millrace.OperationAction {
		if _, _, compensated, err := barrier(millrace.OperationCompensation); err != nil {
			return err
		} else if compensated { // a late action
			if err := record(op, millrace.OutcomeCancelled, "late action"); err != nil {
				return err
			}
			return reply(millrace.OutcomeCancelled, "late action", nil)
		}
	}
	switch p.decide(id, op, attempt) {
	case drop:
		return nil
	case fail:
		if op == millrace.OperationAction {
			if err := record(op, millrace.OutcomeFailure, "refused"); err != nil {
				return err
			}
		}
		return reply(millrace.OutcomeFailure, "refused", nil)
	}
	if op == millrace.OperationAction {
		p.runs.Add(1)
		if err := effect("do"); err != nil {
			return err
		}
		if err := record(op, millrace.OutcomeSuccess, ""); err != nil {
			return err
		}
		return reply(millrace.OutcomeSuccess, "", []byte(`{"tx":"`+p.step+`-`+id+`"}`))
	}
	outcome, _, acted, err := barrier(millrace.OperationAction)
	if err != nil {
		return err
	}
	if acted && outcome == millrace.OutcomeSuccess {
		if err := effect("undo"); err != nil {
			return err
		}
	}
	if err := record(op, millrace.OutcomeSuccess, ""); err != nil {
		return err
	}
	return reply(millrace.OutcomeSuccess, "", nil)
}

// effects returns the effect log of a saga: "step:what" in order.
func (b *testBundle) effects(id string) []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), fmt.Sprintf(`SELECT step || ':' || what FROM %s WHERE saga_id = $1 ORDER BY seq`, b.tbl("test_effect")), id)
	if err != nil {
		b.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return out
}

// waitStatus polls until the saga has one of the statuses, or fails the test after a deadline.
func (b *testBundle) waitStatus(id string, want ...saga.Status) *saga.Instance {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last *saga.Instance
	for time.Now().Before(deadline) {
		in, err := b.o.Get(context.Background(), id)
		if err != nil && !errors.Is(err, saga.ErrNotFound) {
			b.t.Fatal(err)
		}
		if in != nil {
			last = in
			for _, s := range want {
				if in.Status == s {
					return in
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if last != nil {
		b.t.Fatalf("saga %s: status %s (step %s, %s), want %v", id, last.Status, last.Step, last.LastError, want)
	}
	b.t.Fatalf("saga %s not found", id)
	return nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func newRouter(t testing.TB) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
