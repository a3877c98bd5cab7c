package sagatest_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
	"github.com/millrace/millrace/saga/sagatest"
)

// Each invariant check fails when what it checks is broken by hand after a
// clean run: the checks can fail.
func TestChecksCatchTampering(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, sql, want string
	}{
		{"saga not ended", `UPDATE saga_instance SET status = 'running', ended_at = NULL, step = 'ship' WHERE id = 'o1'`, "did not end: running"},
		{"no end time", `UPDATE saga_instance SET ended_at = NULL WHERE id = 'o1'`, "completed without an end time"},
		{"reply applied twice", `INSERT INTO saga_history (saga_id, at, event, step, operation, attempt, outcome, status)
SELECT saga_id, at, event, step, operation, attempt, outcome, 'completed' FROM saga_history
 WHERE saga_id = 'o1' AND event = 'reply' AND step = 'credit'`, "reply credit/action#1 applied twice"},
		{"reply without its command", `DELETE FROM saga_history WHERE saga_id = 'o1' AND event = 'command' AND step = 'stock'`, "reply stock/action#1 applied with no such command sent"},
		{"step done without history", `DELETE FROM saga_history WHERE saga_id = 'o1' AND event = 'step_done' AND step = 'ship'`, "step ship is done, history does not say so"},
		{"history ends elsewhere", `UPDATE saga_history SET status = 'compensated' WHERE id = (SELECT max(id) FROM saga_history WHERE saga_id = 'o1')`, `history ends in status "compensated"`},
		{"barrier without effect", `UPDATE compensation_barrier SET outcome = 'failure' WHERE saga_id = 'o1' AND step = 'stock' AND operation = 'action'`, "step stock: barrier: step is done but its effect is not applied"},
		{"effect applied twice", `INSERT INTO ledger (saga_id, step, delta) VALUES ('o1', 'ship', 1)`, "step ship: effect: applied 2 times"},
		{"effect undone", `INSERT INTO ledger (saga_id, step, delta) VALUES ('o1', 'credit', -1)`, "step credit: effect: step is done but its effect is not applied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := setup(t, 1)
			if r := h.Run(t); len(r.Violations) != 0 {
				t.Fatal(r)
			}
			ctx := context.Background()
			if _, err := h.Pool().Exec(ctx, `BEGIN; SET LOCAL search_path TO `+h.Schema()+`; `+tc.sql+`; COMMIT`); err != nil {
				t.Fatal(err)
			}
			r := h.RunE()
			if !slices.ContainsFunc(r.Violations, func(v string) bool { return strings.Contains(v, tc.want) }) {
				t.Fatalf("want a violation with %q, got %q", tc.want, r.Violations)
			}
		})
	}
	t.Run("poisoned", func(t *testing.T) {
		h := setup(t, 1)
		h.AddHandler("auditor", "ship", nil, func(msg *message.Message) error {
			return core.Permanent(errors.New("cannot read this"))
		})
		r := h.RunE()
		if !slices.ContainsFunc(r.Violations, func(v string) bool { return strings.Contains(v, "poisoned: command o1 ship/action#1 →auditor") }) {
			t.Fatalf("violations %q", r.Violations)
		}
	})
	t.Run("user check", func(t *testing.T) {
		h := setupWith(t, sagatest.Config{Check: func(_ context.Context, _ *sagatest.H, in *saga.Instance) error {
			return errors.New("not on a Sunday")
		}}, 1)
		if r := h.RunE(); !slices.Equal(r.Violations, []string{"saga o1: Check: not on a Sunday"}) {
			t.Fatalf("violations %q", r.Violations)
		}
	})
}
