package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
)

// Migration moves the live instances of one definition version to
// another, on purpose: see Migrate.
type Migration[From, To any] struct {
	// From and To are two versions of one saga type. Required.
	From *Definition[From]
	To   *Definition[To]
	// Steps renames steps: a From step name to its To name. A step not
	// listed keeps its name. Only a step that an instance has not started
	// may be renamed: a participant's barrier keys on the step name, so a
	// renamed started step could never be compensated.
	Steps map[string]string
	// Data upcasts an instance's data. Defaults to decoding the stored
	// JSON into To.
	Data func(From) (To, error)
	// Operator and Reason are recorded in each instance's history.
	// Required.
	Operator, Reason string
}

// ErrCannotMigrate is wrapped by Migrate's error for each instance it left
// on its version, saying why.
var ErrCannotMigrate = errors.New("saga: cannot migrate instance")

// Migrate moves every instance of m.From that has not ended (running,
// compensating, stuck, paused or scheduled) to m.To: each step's state goes to its (renamed) step, the data is
// upcast, the instance records the new version and a "migrated" history
// line, under its row lock. It is for definitions whose change would strand
// instances otherwise; register To first. A saga inside a parallel group
// moves when the group's members are exactly the members of one group of
// To. An instance whose state has no faithful place in To (a started step
// that To lacks or renames, a current step To lacks, a current step that
// changes kind (a wait step that becomes a remote or local step, a remote
// step that becomes local...), a current step that would join a group
// whose other members would never start, a step of To before the current
// one that has not run and never would) or whose data does not upcast (or
// upcasts to what jsonb cannot store) is left as it was and reported in
// the returned error (each wrapping ErrCannotMigrate): every instance of
// m.From that has not ended either moves or is in the error. A paused
// saga stays paused (Resume it on To), a scheduled one keeps its start
// time. A Steps map that sends two From steps to one To step is refused
// (core.ErrConfig). It returns how many moved. A reply in flight for a
// moved instance is still applied: steps keep their names and attempts.
func Migrate[From, To any](ctx context.Context, o *Orchestrator, m Migration[From, To]) (int, error) {
	if m.From == nil || m.To == nil {
		return 0, fmt.Errorf("%w: saga.Migrate: From and To are required", core.ErrConfig)
	}
	from, to := m.From.def, m.To.def
	if from.typ != to.typ || from.version == to.version {
		return 0, fmt.Errorf("%w: saga.Migrate: %s v%d to %s v%d: want two versions of one type", core.ErrConfig, from.typ, from.version, to.typ, to.version)
	}
	if m.Operator == "" || m.Reason == "" {
		return 0, fmt.Errorf("%w: saga.Migrate: Operator and Reason are required", core.ErrConfig)
	}
	for old, renamed := range m.Steps {
		if _, i := from.step(old); i < 0 {
			return 0, fmt.Errorf("%w: saga.Migrate: Steps renames %q, which v%d does not have", core.ErrConfig, old, from.version)
		}
		if _, i := to.step(renamed); i < 0 {
			return 0, fmt.Errorf("%w: saga.Migrate: Steps renames %q to %q, which v%d does not have", core.ErrConfig, old, renamed, to.version)
		}
	}
	// Two old steps must never land on one new step: one's state would
	// overwrite the other's.
	landed := make(map[string]string, len(from.steps))
	for _, s := range from.steps {
		target := s.name
		if r, ok := m.Steps[s.name]; ok {
			target = r
		}
		if other, dup := landed[target]; dup {
			return 0, fmt.Errorf("%w: saga.Migrate: v%d steps %q and %q would both become step %q of v%d", core.ErrConfig,
				from.version, other, s.name, target, to.version)
		}
		landed[target] = s.name
	}
	upcast := func(raw []byte) ([]byte, error) {
		if m.Data == nil {
			var d To
			if err := json.Unmarshal(raw, &d); err != nil {
				return nil, err
			}
			return json.Marshal(d)
		}
		var f From
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, err
		}
		d, err := m.Data(f)
		if err != nil {
			return nil, err
		}
		return json.Marshal(d)
	}
	query := fmt.Sprintf(`SELECT %s FROM %s
 WHERE type = $1 AND def_version = $2 AND status NOT IN ('completed', 'compensated') AND id > $3
 ORDER BY id LIMIT 100 FOR NO KEY UPDATE`, instanceCols, o.sql.instance)
	moved, after := 0, ""
	var problems []error
	for {
		n := 0
		err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
			found, err := queryInstances(ctx, tx, query, from.typ, from.version, after)
			if err != nil {
				return err
			}
			n = len(found)
			now := o.clock.Now()
			for _, in := range found {
				after = in.ID
				if err := migrateOne(in, from, to, m.Steps, upcast); err != nil {
					problems = append(problems, fmt.Errorf("%w %s: %v", ErrCannotMigrate, in.ID, err))
					continue
				}
				mc := &machine{o: o, d: to, in: in, ctx: ctx, tx: tx, now: now}
				mc.hist = append(mc.hist, historyRow{sagaID: in.ID, at: now, event: "migrated", step: in.Step, actor: m.Operator,
					reason: m.Reason, status: string(in.Status), detail: fmt.Appendf(nil, `{"from":%d,"to":%d}`, from.version, to.version)})
				if err := mc.save(); err != nil {
					return err
				}
				if err := o.dropUndeclaredAttrs(ctx, tx, in.ID, to); err != nil { // attr.go
					return err
				}
				if _, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET def_version = $2 WHERE id = $1`, o.sql.instance), in.ID, to.version); err != nil {
					return err
				}
				moved++
			}
			return nil
		})
		if err != nil {
			return moved, fmt.Errorf("saga.Migrate %s v%d to v%d: %w", from.typ, from.version, to.version, err)
		}
		if n == 0 {
			return moved, errors.Join(problems...)
		}
	}
}

// migrateOne rewrites in's step state and data for to, or says why not.
func migrateOne(in *Instance, from, to *def, renames map[string]string, upcast func([]byte) ([]byte, error)) error {
	steps := make(map[string]*StepState, len(in.Steps))
	for name, st := range in.Steps {
		target := name
		if r, ok := renames[name]; ok {
			target = r
			if st.Attempt > 0 || st.Status != StepPending {
				return fmt.Errorf("step %q has started (%s): its participant's barrier knows it by that name, it cannot be renamed", name, st.Status)
			}
		}
		if _, i := to.step(target); i < 0 {
			return fmt.Errorf("step %q has state (%s) and v%d has no step %q", name, st.Status, to.version, target)
		}
		steps[target] = st
	}
	current, err := migrateCurrent(in, from, to, renames, steps)
	if err != nil {
		return err
	}
	data, err := upcast(in.Data)
	if err == nil {
		err = checkStorable(data)
	}
	if err != nil {
		return fmt.Errorf("upcast data: %v", err)
	}
	in.Steps, in.Step, in.Data, in.Version = steps, current, data, to.version
	return nil
}

// migrateCurrent maps in's current step (a step, or a parallel group
// going forward) to its name in to, or says why it has no faithful place
// there: a group whose members are not exactly one group in to, a step
// that joins a group whose other members would never start, or steps of
// to before the current one that have not run and never would.
func migrateCurrent(in *Instance, from, to *def, renames map[string]string, steps map[string]*StepState) (string, error) {
	if in.Step == "" {
		return "", nil
	}
	rename := func(name string) string {
		if r, ok := renames[name]; ok {
			return r
		}
		return name
	}
	var current string
	var at int // the index in to where the current step (or group) begins
	if r, ok := from.groups[in.Step]; ok {
		// Forward in a parallel group: its members must be exactly the
		// members of one group of to.
		var members []string
		group := ""
		for _, s := range from.steps[r[0]:r[1]] {
			name := rename(s.name)
			members = append(members, name)
			ts, _ := to.step(name)
			if ts == nil || ts.group == "" || (group != "" && ts.group != group) {
				return "", fmt.Errorf("current group %q: its members %v are not one parallel group in v%d", in.Step, members, to.version)
			}
			group = ts.group
		}
		for _, fs := range from.steps[r[0]:r[1]] {
			if ts, _ := to.step(rename(fs.name)); shape(ts) != shape(fs) {
				return "", fmt.Errorf("current group %q: step %q is a %s in v%d and a %s in v%d: its state would not fit", in.Step, fs.name, shape(fs), from.version, shape(ts), to.version)
			}
		}
		tr := to.groups[group]
		if tr[1]-tr[0] != len(members) {
			return "", fmt.Errorf("current group %q becomes group %q of v%d, which has other members too: they would never start", in.Step, group, to.version)
		}
		current, at = group, tr[0]
	} else {
		current = rename(in.Step)
		ts, i := to.step(current)
		if ts == nil {
			return "", fmt.Errorf("current step %q is not in v%d", in.Step, to.version)
		}
		if fs, _ := from.step(in.Step); shape(fs) != shape(ts) {
			return "", fmt.Errorf("current step %q is a %s in v%d and a %s in v%d: its state (%s) would not fit", in.Step, shape(fs), from.version, shape(ts), to.version, stepStatus(steps[ts.name]))
		}
		current, at = ts.name, i
		if ts.group != "" && in.Phase == PhaseForward {
			tr := to.groups[ts.group]
			if tr[1]-tr[0] > 1 {
				return "", fmt.Errorf("current step %q is a member of parallel group %q in v%d, whose other members would never start", in.Step, ts.group, to.version)
			}
			current, at = ts.group, tr[0]
		}
	}
	if in.Phase == PhaseForward {
		for _, s := range to.steps[:at] {
			if st := steps[s.name]; st == nil || st.Status == StepPending {
				return "", fmt.Errorf("step %q of v%d comes before the current step %q and has not run: it never would", s.name, to.version, current)
			}
		}
	}
	return current, nil
}

// shape is what kind of step s is: a wait, remote or local step. A step's
// state means something else for each, so the current step of a migrated
// saga must keep its shape.
func shape(s *stepDef) string {
	switch {
	case s.wait != nil:
		return "wait step"
	case s.child != nil:
		return "child step"
	case s.remote:
		return "remote step"
	}
	return "local step"
}

func stepStatus(st *StepState) string {
	if st == nil || st.Status == StepPending {
		return "not started"
	}
	return st.Status
}
