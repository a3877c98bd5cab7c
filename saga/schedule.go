package saga

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartOption is an option of Start and StartTx.
type StartOption func(*startOptions)

type startOptions struct {
	at time.Time
	// parent is the id of the saga whose child step starts this one
	// (child.go); never set with at.
	parent string
}

// StartAt schedules the saga's start at t. If t is after the
// orchestrator's Clock.Now(), Start and StartTx only write the saga's row,
// with status StatusScheduled (listed as scheduled) and a "scheduled"
// history line, and its first step runs when t is due, on the timer pass
// (Run, RunDue) of an orchestrator that has the definition registered:
// the start time is the saga's next wake-up, so it survives a restart like
// any timer. The definition's Deadline counts from the actual start.
// Abort cancels a scheduled saga: it never starts, and nothing of its
// definition runs (no step, no compensation): what the caller wrote in the
// transaction that scheduled it (an order row, say) stays as written; undo
// it yourself where you call Abort, or start the saga at once and let a
// wait step hold it until its time. A t at or before now
// (or the zero time) starts the saga at once, as without the option. A
// repeated start of the same id with the same data returns the saga as it
// is, whatever its start time.
func StartAt(t time.Time) StartOption {
	return func(o *startOptions) { o.at = t }
}

func startOpts(opts []StartOption) startOptions {
	var so startOptions
	for _, f := range opts {
		if f != nil {
			f(&so)
		}
	}
	return so
}

// schedule writes a scheduled saga's row, its keys and attributes (attrs)
// and its "scheduled" history line, or returns the saga that has its id
// already.
func (o *Orchestrator) schedule(ctx context.Context, tx pgx.Tx, d *def, id string, raw []byte, at, now time.Time, attrs []attrValue) (*Instance, error) {
	tag, err := tx.Exec(ctx, o.sql.insertScheduled, id, d.typ, d.version, raw, at, now)
	if err != nil {
		return nil, fmt.Errorf("saga %s: insert: %w", id, o.tablesError(err))
	}
	if tag.RowsAffected() == 0 {
		return o.existing(ctx, tx, d, id, raw)
	}
	in := &Instance{ID: id, Type: d.typ, Version: d.version, Status: StatusScheduled, Phase: PhaseForward,
		Steps: map[string]*StepState{}, Data: raw, Input: raw, Revision: 1, NextWakeupAt: &at, CreatedAt: now, UpdatedAt: now}
	if err := o.writeStartAttrs(ctx, tx, in, attrs); err != nil { // attr.go
		return nil, err
	}
	detail, _ := json.Marshal(map[string]any{"start_at": at})
	err = o.writeHistory(ctx, tx, []historyRow{{sagaID: id, at: now, event: "scheduled", status: string(StatusScheduled), detail: detail}})
	if err != nil {
		return nil, err
	}
	return in, nil
}

// startScheduled starts a scheduled saga whose start time is due.
func (m *machine) startScheduled() error {
	if at := m.in.NextWakeupAt; at != nil && m.now.Before(*at) {
		return nil // woken early: the save keeps its start time
	}
	return m.startNow()
}

// neverStarted reports whether m's saga has not started: scheduled, or
// stuck before its start (its version was not registered at the time).
func (m *machine) neverStarted() bool {
	return m.in.Step == "" && len(m.in.Steps) == 0 && m.in.EndedAt == nil
}

// startNow starts a saga that has not started: its deadline counts from
// now, and its first step runs.
func (m *machine) startNow() error {
	if m.d.deadline > 0 {
		m.in.DeadlineAt = m.due(m.d.deadline)
	}
	m.record("started", "", "", 0, "", "")
	if mt := m.o.metrics; mt != nil {
		typ := m.d.typ
		m.after = append(m.after, func() { mt.started.WithLabelValues(typ).Inc() })
	}
	return m.advance(0)
}

// cancelScheduled ends a saga that has not started, scheduled or stuck
// before its start (Abort).
func (m *machine) cancelScheduled() error {
	m.record("cancelled", "", "", 0, "", "cancelled before its start by an operator")
	return m.end(StatusCompensated, "cancelled before its start by an operator")
}
