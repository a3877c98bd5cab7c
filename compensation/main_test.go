package compensation_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// The test participant reserves credit: the action inserts a reservation
// row and an effect row, the compensation deletes the reservation and adds
// an "undo" effect row. effect has no unique key, so a double application
// shows as two rows.
type reserveCredit struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type reserved struct {
	ReservationID string `json:"reservation_id"`
	Amount        int    `json:"amount"`
}

const replyTopic = "order-saga.replies"

type bundle struct {
	db          *pgtest.DB
	p           *compensation.Participant
	metrics     *prometheus.Registry
	effect      string // quoted schema.effect
	reservation string // quoted schema.reservation
	handle      func(msg *message.Message) error

	actionCalls, compensateCalls atomic.Int64
	// failAction and failCompensation, when set, decide per call whether the
	// function fails, and how (nil: it succeeds).
	failAction, failCompensation atomic.Pointer[func(call compensation.Call) error]
}

func setup(t testing.TB, maxConns int32) *bundle {
	t.Helper()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: maxConns})
	b := &bundle{
		db:          db,
		effect:      sqlident.Table(db.Schema, "effect"),
		reservation: sqlident.Table(db.Schema, "reservation"),
		metrics:     prometheus.NewPedanticRegistry(),
	}
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+b.effect+` (saga_id text NOT NULL, step text NOT NULL, kind text NOT NULL, amount int NOT NULL);
CREATE TABLE `+b.reservation+` (saga_id text NOT NULL, step text NOT NULL, amount int NOT NULL, PRIMARY KEY (saga_id, step))`); err != nil {
		t.Fatal(err)
	}
	p, err := compensation.NewParticipant(db.Pool, compensation.Config{Schema: db.Schema, Name: "payments", Metrics: b.metrics})
	if err != nil {
		t.Fatal(err)
	}
	b.p = p
	if err := compensation.Register(p, "reserve_credit", b.reserve, b.release); err != nil {
		t.Fatal(err)
	}
	b.handle = p.Handle
	return b
}

// tracedParticipant is the bundle's participant again, on a pool of
// maxConns connections whose round trips are counted.
func (b *bundle) tracedParticipant(t testing.TB, maxConns int32) (*compensation.Participant, *pgxpool.Pool, *pgtest.RoundTrips) {
	t.Helper()
	trips := &pgtest.RoundTrips{}
	pool, err := pgtest.ConnectTraced(context.Background(), pgtest.URL(), maxConns, trips)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p, err := compensation.NewParticipant(pool, compensation.Config{Schema: b.db.Schema, Name: "payments", Metrics: b.metrics})
	if err != nil {
		t.Fatal(err)
	}
	if err := compensation.Register(p, "reserve_credit", b.reserve, b.release); err != nil {
		t.Fatal(err)
	}
	return p, pool, trips
}

func (b *bundle) reserve(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd reserveCredit) (reserved, error) {
	b.actionCalls.Add(1)
	// The effect is written before a failure is decided: a business
	// failure must roll it back.
	if _, err := tx.Exec(ctx, `INSERT INTO `+b.effect+` (saga_id, step, kind, amount) VALUES ($1, $2, 'reserve', $3);
`, call.SagaID, call.Step, cmd.Amount); err != nil {
		return reserved{}, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+b.reservation+` (saga_id, step, amount) VALUES ($1, $2, $3)`, call.SagaID, call.Step, cmd.Amount); err != nil {
		return reserved{}, err
	}
	if f := b.failAction.Load(); f != nil {
		if err := (*f)(call); err != nil {
			return reserved{}, err
		}
	}
	return reserved{ReservationID: call.IdempotencyKey, Amount: cmd.Amount}, nil
}

func (b *bundle) release(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd reserveCredit) error {
	b.compensateCalls.Add(1)
	tag, err := tx.Exec(ctx, `DELETE FROM `+b.reservation+` WHERE saga_id = $1 AND step = $2`, call.SagaID, call.Step)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return fmt.Errorf("release %s/%s: no reservation (the barrier ran a compensation without its action)", call.SagaID, call.Step)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+b.effect+` (saga_id, step, kind, amount) VALUES ($1, $2, 'release', $3)`, call.SagaID, call.Step, cmd.Amount); err != nil {
		return err
	}
	if f := b.failCompensation.Load(); f != nil {
		if err := (*f)(call); err != nil {
			return err
		}
	}
	return nil
}

func (b *bundle) setFailAction(f func(call compensation.Call) error) { b.failAction.Store(&f) }
func (b *bundle) setFailCompensation(f func(call compensation.Call) error) {
	b.failCompensation.Store(&f)
}

// command builds a command message by hand, as an orchestrator would.
func command(sagaID, step, operation string, attempt int, payload string) *message.Message {
	msg := message.NewMessage(uuid.NewString(), []byte(payload))
	msg.Metadata.Set(core.MetadataSagaID, sagaID)
	msg.Metadata.Set(core.MetadataSagaType, "order")
	msg.Metadata.Set(core.MetadataSagaStep, step)
	msg.Metadata.Set(core.MetadataSagaAttempt, strconv.Itoa(attempt))
	msg.Metadata.Set(core.MetadataSagaOperation, operation)
	msg.Metadata.Set(core.MetadataSagaCommand, "reserve_credit")
	msg.Metadata.Set(core.MetadataSagaReplyTopic, replyTopic)
	return msg
}

func action(sagaID string, attempt int) *message.Message {
	return command(sagaID, "credit", core.OperationAction, attempt, `{"account":"a-1","amount":40}`)
}

func compensationOf(sagaID string, attempt int) *message.Message {
	return command(sagaID, "credit", core.OperationCompensation, attempt, `{"account":"a-1","amount":40}`)
}

// replyRow is one reply the participant wrote to the outbox.
type replyRow struct {
	SagaID, Step, Attempt, Operation, Outcome, Reason, Payload, Key string
}

func (b *bundle) replies(t testing.TB, sagaID string) []replyRow {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT headers->>'saga_id', headers->>'saga_step', headers->>'saga_attempt',
       headers->>'saga_operation', headers->>'saga_outcome', coalesce(headers->>'saga_reason', ''), payload::text, partition_key
  FROM `+sqlident.Table(b.db.Schema, "outbox_event")+` WHERE topic = $1 AND partition_key = $2 ORDER BY id`, replyTopic, sagaID)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (replyRow, error) {
		var x replyRow
		err := r.Scan(&x.SagaID, &x.Step, &x.Attempt, &x.Operation, &x.Outcome, &x.Reason, &x.Payload, &x.Key)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *bundle) effects(t testing.TB, sagaID, kind string) int {
	return b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE saga_id = $1 AND kind = $2`, sagaID, kind)
}

func (b *bundle) barrier(t testing.TB, sagaID, operation string) (outcome string, empty bool, ok bool) {
	t.Helper()
	err := b.db.Pool.QueryRow(context.Background(), `SELECT outcome, empty FROM `+sqlident.Table(b.db.Schema, "compensation_barrier")+
		` WHERE saga_id = $1 AND operation = $2`, sagaID, operation).Scan(&outcome, &empty)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return outcome, empty, true
}

// metric sums the series of millrace_compensation_<name>.
func (b *bundle) metric(t testing.TB, name string) float64 {
	t.Helper()
	mfs, err := b.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "millrace_compensation_"+name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
