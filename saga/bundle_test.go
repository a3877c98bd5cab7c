package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sagahook"
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

// testBundle is a schema, an orchestrator on it, an in-process Watermill
// transport and a router (see e2e for what runs on them).
type testBundle struct {
	t      testing.TB
	db     *pgtest.DB
	w      *outbox.Writer
	o      *saga.Orchestrator
	pubsub *gochannel.GoChannel
	router *message.Router
	clock  interface{ Now() time.Time }
	tbl    func(string) string
	// replyTopic is where participants reply (from the registered definition).
	replyTopic string
}

type bundleOptions struct {
	clock   interface{ Now() time.Time }
	hook    sagahook.Func
	poll    time.Duration
	metrics *prometheus.Registry
	// noProgressAfter is Config.NoProgressAfter.
	noProgressAfter time.Duration
	logger          watermill.LoggerAdapter
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
		PollInterval: opts.poll, Metrics: registerer(opts.metrics), NoProgressAfter: opts.noProgressAfter, Logger: opts.logger})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{t: t, db: db, w: w, o: o, clock: opts.clock,
		tbl:    func(name string) string { return sqlident.Table(db.Schema, name) },
		pubsub: gochannel.NewGoChannel(gochannel.Config{Persistent: true, OutputChannelBuffer: 1024}, watermill.NopLogger{}),
	}
	t.Cleanup(func() { b.pubsub.Close() })
	b.router = newRouter(t)
	// The participants' and local steps' effects, in order.
	_, err = db.Pool.Exec(context.Background(), fmt.Sprintf(
		`CREATE TABLE %s (seq bigint GENERATED ALWAYS AS IDENTITY, saga_id text, step text, what text)`, b.tbl("test_effect")))
	if err != nil {
		t.Fatal(err)
	}
	return b
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

// registerer is reg as a Config.Metrics: nil when reg is.
func registerer(reg *prometheus.Registry) prometheus.Registerer {
	if reg == nil {
		return nil
	}
	return reg
}
