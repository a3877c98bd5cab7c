package compensation_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/migrations"
)

type ReserveCredit struct {
	Account string `json:"account"`
	Amount  int    `json:"amount"`
}

type CreditReserved struct {
	Left int `json:"left"`
}

// A payments participant: the action reserves credit, the compensation
// releases it. The orchestrator's commands are built by hand here; in a
// service they come from the saga package through the broker, and
// AddToRouter wires the handler.
func Example_participant() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// A schema of its own, dropped at the end.
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx) // millrace's tables
	}
	if err != nil {
		log.Fatal(err)
	}
	account := pgx.Identifier{schema, "account"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+account+` (id text PRIMARY KEY, credit int NOT NULL);
INSERT INTO `+account+` VALUES ('alice', 100)`); err != nil {
		log.Fatal(err)
	}

	p, err := compensation.NewParticipant(pool, compensation.Config{Schema: schema, Name: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	err = compensation.Register(p, "reserve_credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) (CreditReserved, error) {
			var left int
			err := tx.QueryRow(ctx, `UPDATE `+account+` SET credit = credit - $2 WHERE id = $1 RETURNING credit`, cmd.Account, cmd.Amount).Scan(&left)
			if err != nil {
				return CreditReserved{}, err
			}
			if left < 0 {
				return CreditReserved{}, compensation.Fail("insufficient credit")
			}
			return CreditReserved{Left: left}, nil
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) error {
			_, err := tx.Exec(ctx, `UPDATE `+account+` SET credit = credit + $2 WHERE id = $1`, cmd.Account, cmd.Amount)
			return err
		})
	if err != nil {
		log.Fatal(err)
	}
	// Handle runs each command in a transaction of its own, with its inbox
	// dedup mark, as a batch of one.
	handle := p.Handle

	sent := 0
	send := func(sagaID, operation string, attempt, amount int) {
		sent++ // every command is a new message
		msg := message.NewMessage(fmt.Sprintf("0190a6b4-6b1c-7c4e-9a55-%012d", sent), fmt.Appendf(nil, `{"account":"alice","amount":%d}`, amount))
		msg.Metadata.Set(core.MetadataSagaID, sagaID)
		msg.Metadata.Set(core.MetadataSagaStep, "credit")
		msg.Metadata.Set(core.MetadataSagaAttempt, fmt.Sprint(attempt))
		msg.Metadata.Set(core.MetadataSagaOperation, operation)
		msg.Metadata.Set(core.MetadataSagaCommand, "reserve_credit")
		msg.Metadata.Set(core.MetadataSagaReplyTopic, "orders.replies")
		if err := handle(msg); err != nil {
			log.Fatal(err)
		}
		var outcome, reason, payload string
		_ = pool.QueryRow(ctx, `SELECT headers->>'saga_outcome', coalesce(headers->>'saga_reason', ''), payload::text FROM `+
			pgx.Identifier{schema, "outbox_event"}.Sanitize()+` ORDER BY id DESC LIMIT 1`).Scan(&outcome, &reason, &payload)
		var credit int
		_ = pool.QueryRow(ctx, `SELECT credit FROM `+account).Scan(&credit)
		if reason != "" {
			reason = " (" + reason + ")"
		}
		fmt.Printf("%s %s #%d: %s %s%s, credit %d\n", sagaID, operation, attempt, outcome, payload, reason, credit)
	}
	send("order-1", core.OperationAction, 1, 30)       // runs
	send("order-1", core.OperationAction, 2, 30)       // a retry: the same answer, not run again
	send("order-1", core.OperationCompensation, 1, 30) // undoes it
	send("order-2", core.OperationCompensation, 1, 50) // empty: its action never ran
	send("order-2", core.OperationAction, 1, 50)       // late: cancelled, not run
	send("order-3", core.OperationAction, 1, 500)      // a business failure
	// Output:
	// order-1 action #1: success {"left":70}, credit 70
	// order-1 action #2: success {"left":70}, credit 70
	// order-1 compensation #1: success {}, credit 100
	// order-2 compensation #1: success {}, credit 100
	// order-2 action #1: cancelled {} (compensated before the action arrived), credit 100
	// order-3 action #1: failure {} (insufficient credit), credit 100
}
