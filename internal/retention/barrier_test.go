package retention

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
)

// barrierBundle is a schema and a participant on it whose one command,
// reserve_credit, counts the times its action ran.
type barrierBundle struct {
	db          *pgtest.DB
	p           *compensation.Participant
	actionCalls atomic.Int64
}

type credit struct {
	Amount int `json:"amount"`
}

func barrierSetup(t *testing.T) *barrierBundle {
	t.Helper()
	b := &barrierBundle{db: pgtest.NewWith(t, pgtest.Options{MaxConns: 4})}
	p, err := compensation.NewParticipant(b.db.Pool, compensation.Config{Schema: b.db.Schema, Name: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	err = compensation.Register(p, "reserve_credit",
		func(context.Context, pgx.Tx, compensation.Call, credit) (credit, error) {
			b.actionCalls.Add(1)
			return credit{}, nil
		},
		func(context.Context, pgx.Tx, compensation.Call, credit) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	b.p = p
	return b
}

// handle runs a command of saga sagaID on the participant, as an
// orchestrator would send it.
func (b *barrierBundle) handle(t testing.TB, sagaID, step, operation string, attempt int) {
	t.Helper()
	msg := message.NewMessage(uuid.NewString(), []byte(`{"amount":40}`))
	msg.Metadata.Set(core.MetadataSagaID, sagaID)
	msg.Metadata.Set(core.MetadataSagaType, "order")
	msg.Metadata.Set(core.MetadataSagaStep, step)
	msg.Metadata.Set(core.MetadataSagaAttempt, strconv.Itoa(attempt))
	msg.Metadata.Set(core.MetadataSagaOperation, operation)
	msg.Metadata.Set(core.MetadataSagaCommand, "reserve_credit")
	msg.Metadata.Set(core.MetadataSagaReplyTopic, "order-saga.replies")
	if err := b.p.Handle(msg); err != nil {
		t.Fatalf("%s %s of saga %s: %v", operation, step, sagaID, err)
	}
}

// age makes a saga's barrier row of step and operation d old.
func (b *barrierBundle) age(t testing.TB, sagaID, step, operation string, d time.Duration) {
	t.Helper()
	exec(t, b.db, `UPDATE {compensation_barrier} SET updated_at = now() - $4::bigint * interval '1 second', created_at = now() - $4::bigint * interval '1 second'
 WHERE saga_id = $1 AND step = $2 AND operation = $3`, sagaID, step, operation, int64(d/time.Second))
}

func (b *barrierBundle) rows(t testing.TB, sagaID string) int {
	return count(t, b.db, `SELECT count(*) FROM {compensation_barrier} WHERE saga_id = $1`, sagaID)
}

// A pass removes the barrier rows of sagas whose every row is older than
// the window, all of a saga's rows together, and nothing else.
func TestPassRemovesOnlyEndedSagasBarrierRows(t *testing.T) {
	t.Parallel()
	b := barrierSetup(t)
	const window = 24 * time.Hour
	old, old2, straddling, recent, empty := uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString(), uuid.NewString()
	for _, s := range []string{old, old2, straddling, recent} {
		b.handle(t, s, "credit", core.OperationAction, 1)
		b.handle(t, s, "credit", core.OperationCompensation, 1)
	}
	b.handle(t, empty, "credit", core.OperationCompensation, 1) // an empty compensation: two rows, action cancelled
	for _, s := range []string{old, old2, empty} {
		b.age(t, s, "credit", core.OperationAction, 3*window)
		b.age(t, s, "credit", core.OperationCompensation, 2*window)
	}
	// The action is old, its compensation recent: the saga has not ended.
	b.age(t, straddling, "credit", core.OperationAction, 3*window)
	// A second step of old2, also old.
	b.handle(t, old2, "stock", core.OperationAction, 1)
	b.age(t, old2, "stock", core.OperationAction, 30*24*time.Hour)

	c := newCleaner(t, b.db, Config{Barrier: window}, batchSizes{barrier: 1})
	if r := pass(t, c); r != (Removed{Barrier: 7}) {
		t.Fatalf("Pass removed %+v, want 7 barrier rows (2 + 3 + 2)", r)
	}
	for s, want := range map[string]int{old: 0, old2: 0, empty: 0, straddling: 2, recent: 2} {
		if got := b.rows(t, s); got != want {
			t.Fatalf("saga %s: %d rows left, want %d", s, got, want)
		}
	}
	if r := pass(t, c); r != (Removed{}) {
		t.Fatalf("second pass removed %+v; want nothing", r)
	}
	// The kept barrier still decides: a late duplicate action of the
	// straddling saga does not run.
	calls := b.actionCalls.Load()
	b.handle(t, straddling, "credit", core.OperationAction, 9)
	if b.actionCalls.Load() != calls {
		t.Fatal("the action ran again after the pass")
	}
}

// Run removes, with the default 7-day window, the rows of a saga no
// command of which arrived for 8 days.
func TestRunRemovesBarrierRowsWithTheDefaultWindow(t *testing.T) {
	t.Parallel()
	b := barrierSetup(t)
	old, recent := uuid.NewString(), uuid.NewString()
	b.handle(t, old, "credit", core.OperationAction, 1)
	b.handle(t, recent, "credit", core.OperationAction, 1)
	b.age(t, old, "credit", core.OperationAction, 8*24*time.Hour)
	b.age(t, recent, "credit", core.OperationAction, 6*24*time.Hour)
	c := newCleaner(t, b.db, Config{Interval: 10 * time.Millisecond}, batchSizes{})
	runUntil(t, c, "the 8-day-old saga's barrier rows to go", func() bool { return b.rows(t, old) == 0 })
	if n := b.rows(t, recent); n != 1 {
		t.Fatalf("the 6-day-old saga has %d barrier rows, want 1", n)
	}
}
