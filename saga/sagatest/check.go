package sagatest

import (
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// check runs the invariants on every saga of the schema, and returns the
// violations. They are:
//
//   - every saga ended: completed, compensated, or stuck with a reason;
//   - no reply was applied twice, and none without its command;
//   - every participant effect matches its step's final state, as the
//     compensation barrier records it and as Config.Effects reports it: a
//     step done has its effect once, a step failed, compensated, never
//     started or skipped by its condition has none, and no step has it
//     more than once;
//   - the history agrees with the final state: it starts with "started",
//     ends in the saga's status, records the step states;
//   - no message was poisoned, and nothing is left in the transport or
//     the outbox;
//   - Config.Check, if set, holds for every saga.
func (h *H) check() []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	for _, p := range h.poisoned {
		add("poisoned: %s", p)
	}
	if n := len(h.queue) + len(h.delayed); n > 0 {
		add("%d messages never delivered", n)
	}
	rows, err := h.Pool().Query(h.ctx, fmt.Sprintf(`SELECT id FROM %s ORDER BY id`, h.Table("saga_instance")))
	if err != nil {
		return append(out, err.Error())
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return append(out, err.Error())
	}
	barrier, err := h.barrier()
	if err != nil {
		return append(out, err.Error())
	}
	for _, id := range ids {
		in, err := h.o.Get(h.ctx, id)
		if err != nil {
			add("saga %s: %v", id, err)
			continue
		}
		hist, err := h.o.History(h.ctx, id)
		if err != nil {
			add("saga %s: %v", id, err)
			continue
		}
		for _, v := range append(checkSaga(in, hist), h.checkEvents(id)...) {
			add("saga %s: %s", id, v)
		}
		undone, sent := compensationsSent(hist), actionsSent(hist)
		for _, step := range sortedKeys(barrier[id]) {
			if v := checkEffect(in, undone, sent, step, barrier[id][step]); v != "" {
				add("saga %s: step %s: barrier: %s", id, step, v)
			}
		}
		if h.cfg.Effects != nil {
			eff, err := h.cfg.Effects(h.ctx, h, id)
			if err != nil {
				add("saga %s: Effects: %v", id, err)
			}
			for _, step := range sortedKeys(eff) {
				if v := checkEffect(in, undone, sent, step, eff[step]); v != "" {
					add("saga %s: step %s: effect: %s", id, step, v)
				}
			}
		}
		if h.cfg.Check != nil {
			if err := h.cfg.Check(h.ctx, h, in); err != nil {
				add("saga %s: Check: %v", id, err)
			}
		}
	}
	return out
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// barrier returns, per saga and step, the effect the compensation barrier
// says is applied: 1 if the action succeeded and no compensation
// succeeded since, else 0.
func (h *H) barrier() (map[string]map[string]int, error) {
	rows, err := h.Pool().Query(h.ctx, fmt.Sprintf(`SELECT a.saga_id, a.step,
       (a.outcome = 'success' AND coalesce(c.outcome, '') <> 'success')::int
  FROM %[1]s a LEFT JOIN %[1]s c ON c.saga_id = a.saga_id AND c.step = a.step AND c.operation = 'compensation'
 WHERE a.operation = 'action'`, h.Table("compensation_barrier")))
	if err != nil {
		return nil, fmt.Errorf("sagatest: barrier: %w", err)
	}
	out := map[string]map[string]int{}
	var id, step string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &step, &n}, func() error {
		if out[id] == nil {
			out[id] = map[string]int{}
		}
		out[id][step] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sagatest: barrier: %w", err)
	}
	return out, nil
}

// compensationsSent returns the steps a compensation was sent (or run)
// for.
func compensationsSent(hist []saga.HistoryEntry) map[string]bool {
	out := map[string]bool{}
	for _, e := range hist {
		if (e.Event == "command" && e.Operation == core.OperationCompensation) || e.Event == "step_compensated" {
			out[e.Step] = true
		}
	}
	return out
}

// actionsSent returns the steps an action command was sent for.
func actionsSent(hist []saga.HistoryEntry) map[string]bool {
	out := map[string]bool{}
	for _, e := range hist {
		if e.Event == "command" && e.Operation == core.OperationAction {
			out[e.Step] = true
		}
	}
	return out
}

// checkEffect checks that n, the times a step's effect is applied, agrees
// with the step's state. A step compensated with no compensation sent has
// nothing to undo (the definition gives it no compensation): not checked.
// A step skipped with no action sent (its condition was false, Step.When)
// has no effect.
func checkEffect(in *saga.Instance, undone, sent map[string]bool, step string, n int) string {
	st := in.Steps[step]
	status := saga.StepPending
	if st != nil {
		status = st.Status
	}
	if n < 0 || n > 1 {
		return fmt.Sprintf("applied %d times (step %q)", n, status)
	}
	switch status {
	case saga.StepDone:
		if n != 1 {
			return fmt.Sprintf("step is done but its effect is not applied (saga %s)", in.Status)
		}
	case saga.StepCompensated:
		if n != 0 && undone[step] {
			return fmt.Sprintf("step is compensated but its effect is applied (saga %s)", in.Status)
		}
	case saga.StepPending, saga.StepFailed:
		if n != 0 {
			return fmt.Sprintf("step is %q but its effect is applied (saga %s)", status, in.Status)
		}
	case saga.StepSkipped:
		if n != 0 && !sent[step] {
			return fmt.Sprintf("step was skipped before its action was sent but its effect is applied (saga %s)", in.Status)
		}
	}
	return ""
}

// checkSaga checks one saga's final state against its history.
func checkSaga(in *saga.Instance, hist []saga.HistoryEntry) []string {
	out := checkEnd(in)
	if len(hist) == 0 {
		return append(out, "no history")
	}
	return append(out, checkHistory(in, hist)...)
}

// checkEnd checks that the saga ended, completed or compensated, or is
// visibly stuck with its reason, and has no timer left.
func checkEnd(in *saga.Instance) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	switch in.Status {
	case saga.StatusCompleted, saga.StatusCompensated:
		if in.EndedAt == nil {
			add("%s without an end time", in.Status)
		}
		if in.Step != "" {
			add("%s with a current step %q", in.Status, in.Step)
		}
		if in.NextWakeupAt != nil {
			add("%s with a timer", in.Status)
		}
	case saga.StatusStuck:
		if in.LastError == "" {
			add("stuck without a reason")
		}
		if in.NextWakeupAt != nil {
			add("stuck with a timer")
		}
	default:
		add("did not end: %s at step %q (%s)", in.Status, in.Step, in.LastError)
	}
	return out
}

// checkHistory checks the saga's history against itself and the saga: its
// start and end, each command's attempts growing, each reply applied once
// and to a command sent, and each step's state matching its last event.
func checkHistory(in *saga.Instance, hist []saga.HistoryEntry) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if hist[0].Event != "started" {
		add("history starts with %q, not started", hist[0].Event)
	}
	if last := hist[len(hist)-1]; last.Status != in.Status {
		add("history ends in status %q, the saga is %q", last.Status, in.Status)
	}
	// The last terminal event agrees with the status.
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		if e.Event != "completed" && e.Event != "compensated" && e.Event != "stuck" {
			continue
		}
		if e.Event != string(in.Status) {
			add("history's last end is %q, the saga is %q", e.Event, in.Status)
		} else if in.Status == saga.StatusStuck && e.Reason != in.LastError {
			add("stuck for %q, history says %q", in.LastError, e.Reason)
		}
		break
	}
	type opKey struct {
		step, op string
		attempt  int
	}
	commands := map[opKey]bool{}
	applied := map[opKey]int{}
	lastAttempt := map[[2]string]int{}
	succeeded := map[[2]string]int{}
	lastStepEvent := map[string]saga.HistoryEntry{}
	sentComp := map[string]bool{}
	for _, e := range hist {
		k := opKey{e.Step, e.Operation, e.Attempt}
		switch e.Event {
		case "command":
			commands[k] = true
			if prev := lastAttempt[[2]string{e.Step, e.Operation}]; e.Attempt <= prev {
				add("command %s/%s attempt %d after attempt %d", e.Step, e.Operation, e.Attempt, prev)
			}
			lastAttempt[[2]string{e.Step, e.Operation}] = e.Attempt
			if e.Operation == core.OperationCompensation {
				sentComp[e.Step] = true
			}
		case "reply":
			applied[k]++
			if applied[k] == 2 {
				add("reply %s/%s#%d applied twice", e.Step, e.Operation, e.Attempt)
			}
			if !commands[k] {
				add("reply %s/%s#%d applied with no such command sent", e.Step, e.Operation, e.Attempt)
			}
			if e.Outcome == core.OutcomeSuccess {
				succeeded[[2]string{e.Step, e.Operation}]++
				if succeeded[[2]string{e.Step, e.Operation}] == 2 {
					add("two success replies of %s/%s applied", e.Step, e.Operation)
				}
			}
		case "step_done", "step_compensated":
			lastStepEvent[e.Step] = e
			if e.Event == "step_done" && commands[opKey{e.Step, core.OperationAction, e.Attempt}] &&
				applied[opKey{e.Step, core.OperationAction, e.Attempt}] == 0 {
				add("step %s done at attempt %d with no reply applied", e.Step, e.Attempt)
			}
		}
	}
	for name, st := range in.Steps {
		last, ok := lastStepEvent[name]
		switch st.Status {
		case saga.StepDone:
			if !ok || last.Event != "step_done" {
				add("step %s is done, history does not say so", name)
			}
		case saga.StepCompensated:
			if ok && last.Event != "step_compensated" && sentComp[name] {
				add("step %s is compensated, history does not say so", name)
			}
		}
	}
	return out
}
