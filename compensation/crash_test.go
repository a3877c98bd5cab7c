package compensation_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

const (
	childSchemaEnv = "MILLRACE_COMPENSATION_CHILD_SCHEMA"
	childSagaEnv   = "MILLRACE_COMPENSATION_CHILD_SAGA"
	childOpEnv     = "MILLRACE_COMPENSATION_CHILD_OPERATION"
	childMsgEnv    = "MILLRACE_COMPENSATION_CHILD_MESSAGE"
)

// TestHelperParticipantChild is not a test: TestParticipantKilledMidHandler
// runs the test binary again with this test selected, and kills it while
// its action or compensation has written its effect (after the barrier
// claim) and waits.
func TestHelperParticipantChild(t *testing.T) {
	schema := os.Getenv(childSchemaEnv)
	if schema == "" {
		t.Skip("helper process for TestParticipantKilledMidHandler")
	}
	pool, err := pgtest.Connect(context.Background(), pgtest.URL(), 2)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p, err := compensation.NewParticipant(pool, compensation.Config{Schema: schema, Name: "payments"})
	if err != nil {
		t.Fatal(err)
	}
	effect := sqlident.Table(schema, "effect")
	block := func(ctx context.Context, tx pgx.Tx, call compensation.Call, kind string) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+effect+` (saga_id, step, kind, amount) VALUES ($1, $2, $3, 0)`, call.SagaID, call.Step, kind); err != nil {
			return err
		}
		childtest.Announce()
		select {} // blocked mid-handler until killed
	}
	err = compensation.Register(p, "reserve_credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, _ reserveCredit) (reserved, error) {
			return reserved{}, block(ctx, tx, call, "reserve")
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, _ reserveCredit) error {
			return block(ctx, tx, call, "release")
		})
	if err != nil {
		t.Fatal(err)
	}
	msg := command(os.Getenv(childSagaEnv), "credit", os.Getenv(childOpEnv), 1, `{"account":"a-1","amount":40}`)
	msg.UUID = os.Getenv(childMsgEnv)
	_ = p.Handle(msg)
}

// killChild runs the child on one command and SIGKILLs it mid-handler.
func killChild(t *testing.T, schema, saga, operation, msgID string) {
	t.Helper()
	childtest.KillAtReady(t, "TestHelperParticipantChild",
		[]string{childSchemaEnv + "=" + schema, childSagaEnv + "=" + saga, childOpEnv + "=" + operation, childMsgEnv + "=" + msgID}, 60*time.Second)
}

// A participant killed with SIGKILL mid-action, and again mid-compensation,
// leaves no barrier row without its effect, and no reply: the redelivery
// of the same message runs the function once.
func TestParticipantKilledMidHandler(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	saga := "saga-killed"
	barrierRows := func(op string) int {
		return b.count(t, `SELECT count(*) FROM `+sqlident.Table(b.db.Schema, "compensation_barrier")+` WHERE saga_id = $1 AND operation = $2`, saga, op)
	}
	check := func(stage string, wantRows, wantEffects, wantReplies int) {
		t.Helper()
		if n := barrierRows(core.OperationAction) + barrierRows(core.OperationCompensation); n != wantRows {
			t.Fatalf("%s: %d barrier rows, want %d", stage, n, wantRows)
		}
		if n := b.count(t, `SELECT count(*) FROM `+b.effect+` WHERE saga_id = $1`, saga); n != wantEffects {
			t.Fatalf("%s: %d effects, want %d", stage, n, wantEffects)
		}
		if n := len(b.replies(t, saga)); n != wantReplies {
			t.Fatalf("%s: %d replies, want %d", stage, n, wantReplies)
		}
	}

	a := action(saga, 1)
	killChild(t, b.db.Schema, saga, core.OperationAction, a.UUID)
	check("killed mid-action", 0, 0, 0)
	must(t, b.handle(a)) // the redelivery
	must(t, b.handle(a.Copy()))
	check("action redelivered", 1, 1, 1)

	c := compensationOf(saga, 1)
	killChild(t, b.db.Schema, saga, core.OperationCompensation, c.UUID)
	check("killed mid-compensation", 1, 1, 1)
	must(t, b.handle(c))
	check("compensation redelivered", 2, 2, 2)
	if n := b.count(t, `SELECT count(*) FROM `+b.reservation+` WHERE saga_id = $1`, saga); n != 0 {
		t.Fatal("the reservation survived its compensation")
	}
	if b.actionCalls.Load() != 1 || b.compensateCalls.Load() != 1 {
		t.Fatalf("calls: action %d, compensation %d; want 1 and 1", b.actionCalls.Load(), b.compensateCalls.Load())
	}
}
