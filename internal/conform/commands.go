package conform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/internal/sqlident"
)

// EnvCrashFile names the environment variable that holds the path of the
// crash file: a conformance action whose payload says "crash" crashes its
// process while the file exists, once (it removes it first).
const EnvCrashFile = "MILLRACE_CONFORM_CRASH_FILE"

// CrashExitStatus is the exit status of a participant that crashed at the
// conformance action's crash point.
const CrashExitStatus = 3

// EffectsTableSQL creates the conformance participant's effects table in
// schema (a validated name).
func EffectsTableSQL(schema string) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    saga_id   text        NOT NULL,
    step      text        NOT NULL,
    operation text        NOT NULL,
    amount    bigint      NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
)`, sqlident.Table(schema, "conform_effect"))
}

// EffectsQuery is the default query of the effects: saga id, step,
// operation, amount.
func EffectsQuery(schema string) string {
	return fmt.Sprintf(`SELECT saga_id, step, operation, amount FROM %s`, sqlident.Table(schema, "conform_effect"))
}

// Reserve is the conformance command's payload.
type Reserve struct {
	Amount           int64  `json:"amount"`
	Fail             string `json:"fail"`
	FailCompensation string `json:"fail_compensation"`
	Crash            bool   `json:"crash"`
}

// Reserved is the conformance action's reply.
type Reserved struct {
	Reserved int64  `json:"reserved"`
	Key      string `json:"key"`
}

// Register registers the conformance command (docs/protocol.md, "The
// conformance participant") with p, its effects going to schema's
// conform_effect. crash is called at the action's crash point when its
// payload says "crash": it should end the process at once (CrashProcess);
// a test in process returns a technical error from it instead, which rolls
// the transaction back as a crash would.
func Register(p *compensation.Participant, schema string, crash func(compensation.Call) error) error {
	insert := fmt.Sprintf(`INSERT INTO %s (saga_id, step, operation, amount) VALUES ($1, $2, $3, $4)`,
		sqlident.Table(schema, "conform_effect"))
	return compensation.Register(p, Command,
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd Reserve) (Reserved, error) {
			if _, err := tx.Exec(ctx, insert, call.SagaID, call.Step, call.Operation, cmd.Amount); err != nil {
				return Reserved{}, err
			}
			if cmd.Crash {
				if err := crash(call); err != nil {
					return Reserved{}, err
				}
			}
			if cmd.Fail != "" {
				return Reserved{}, compensation.Fail(cmd.Fail)
			}
			return Reserved{Reserved: cmd.Amount, Key: call.IdempotencyKey}, nil
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd Reserve) error {
			var r Reserved
			if err := json.Unmarshal(call.ActionReply, &r); err != nil {
				return fmt.Errorf("conform: the action's reply %q: %w", call.ActionReply, err)
			}
			if _, err := tx.Exec(ctx, insert, call.SagaID, call.Step, call.Operation, r.Reserved); err != nil {
				return err
			}
			if cmd.FailCompensation != "" {
				return compensation.Fail(cmd.FailCompensation)
			}
			return nil
		})
}

// CrashProcess ends the process with CrashExitStatus if the crash file
// (EnvCrashFile) exists, after removing it, so that the restarted process
// does not crash again. Without the file it returns nil.
func CrashProcess(compensation.Call) error {
	f := os.Getenv(EnvCrashFile)
	if f == "" {
		return nil
	}
	if err := os.Remove(f); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	os.Exit(CrashExitStatus)
	return nil
}
