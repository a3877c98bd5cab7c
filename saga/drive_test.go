package saga_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// manualClock is a Clock the test moves by hand.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// driver plays the participants by hand: it reads the commands the
// orchestrator wrote to the outbox and hands replies straight to the
// orchestrator's Handler, with no relay, broker or timer loop running.
type driver struct {
	*testBundle
	clock   *manualClock
	handler message.NoPublishHandlerFunc
}

func setupDriver(t testing.TB, defs func(b *testBundle) []saga.Registrable) *driver {
	t.Helper()
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock})
	if err := b.o.Register(defs(b)...); err != nil {
		t.Fatal(err)
	}
	return &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
}

// cmd is a command as the orchestrator wrote it.
type cmd struct {
	Topic, Step, Op, Command string
	Attempt                  int
	Payload                  string
}

// commands returns the saga's commands in the outbox, in order.
func (d *driver) commands(id string) []cmd {
	d.t.Helper()
	rows, err := d.db.Pool.Query(context.Background(), fmt.Sprintf(`SELECT topic, headers, payload::text FROM %s
 WHERE partition_key = $1 AND headers ? 'saga_operation' AND NOT headers ? 'saga_outcome' ORDER BY id`, d.tbl("outbox_event")), id)
	if err != nil {
		d.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cmd, error) {
		var c cmd
		var h map[string]string
		if err := r.Scan(&c.Topic, &h, &c.Payload); err != nil {
			return c, err
		}
		c.Step, c.Op, c.Command = h[core.MetadataSagaStep], h[core.MetadataSagaOperation], h[core.MetadataSagaCommand]
		c.Attempt, _ = strconv.Atoi(h[core.MetadataSagaAttempt])
		return c, nil
	})
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

func (d *driver) last(id string) cmd {
	d.t.Helper()
	c := d.commands(id)
	if len(c) == 0 {
		d.t.Fatalf("saga %s sent no command", id)
	}
	return c[len(c)-1]
}

// replyMsg builds a reply to a command.
func replyMsg(id string, c cmd, outcome, reason string, payload string) *message.Message {
	if payload == "" {
		payload = "{}"
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata = message.Metadata{
		core.MetadataSagaID: id, core.MetadataSagaType: "order", core.MetadataSagaStep: c.Step,
		core.MetadataSagaAttempt: strconv.Itoa(c.Attempt), core.MetadataSagaOperation: c.Op,
		core.MetadataSagaOutcome: outcome, core.MetadataSagaReason: reason,
	}
	return msg
}

func (d *driver) deliver(msg *message.Message) {
	d.t.Helper()
	if err := d.handler(msg); err != nil {
		d.t.Fatal(err)
	}
}

func (d *driver) reply(id string, c cmd, outcome string) {
	d.t.Helper()
	d.deliver(replyMsg(id, c, outcome, "because", ""))
}

func (d *driver) get(id string) *saga.Instance {
	d.t.Helper()
	in, err := d.o.Get(context.Background(), id)
	if err != nil {
		d.t.Fatal(err)
	}
	return in
}

// tick moves the clock and fires what is due.
func (d *driver) tick(by time.Duration) {
	d.t.Helper()
	d.clock.Advance(by)
	for {
		n, err := d.o.RunDue(context.Background())
		if err != nil {
			d.t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

func historyOf(t testing.TB, o *saga.Orchestrator, id string) []saga.HistoryEntry {
	t.Helper()
	h, err := o.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func asJSON(v any) string { return string(mustJSON(v)) }

var _ = json.Valid
