package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pipeline"
	"github.com/millrace/millrace/internal/sagahook"
)

// Errors of Start and of the operator API.
var (
	// ErrNotFound: no saga has the given id.
	ErrNotFound = errors.New("saga: not found")
	// ErrAlreadyStarted: Start was called with an id that belongs to a
	// saga of another type, version or start data. A second start with the
	// same type, version and data is not an error: it returns the saga.
	ErrAlreadyStarted = errors.New("saga: id already started with different data")
	// ErrNotRegistered: the saga's type and version are not registered
	// with this Orchestrator.
	ErrNotRegistered = errors.New("saga: definition not registered")
	// ErrActionNotAllowed: the operator action does not apply to the
	// saga in its current state (the error says why).
	ErrActionNotAllowed = errors.New("saga: action not allowed")
	// ErrInvalidID: a saga id must be non-empty, at most 200 bytes of
	// valid UTF-8 without NUL.
	ErrInvalidID = errors.New("saga: invalid saga id")
)

// Start starts a saga of def with data, in a transaction of its own; see
// StartTx.
func Start[D any](ctx context.Context, o *Orchestrator, def *Definition[D], id string, data D, opts ...StartOption) (*Instance, error) {
	var in *Instance
	// StartTx leaves the first commands' write queued: it goes out with
	// the COMMIT, in one round trip.
	err := pipeline.BeginFunc(ctx, o.pool, func(tx *pipeline.Tx) error {
		var err error
		in, err = StartTx(ctx, tx, o, def, id, data, opts...)
		if err != nil {
			return err
		}
		return o.callHook(ctx, sagahook.BeforeCommit, in.ID)
	})
	if err != nil {
		return nil, err
	}
	if err := o.callHook(ctx, sagahook.AfterCommit, in.ID); err != nil {
		return in, err
	}
	return in, nil
}

// StartTx starts a saga of def with data in the caller's transaction: the
// saga row and its first command (through the outbox) commit with the
// caller's own changes, or not at all. Leading local steps run at once, in
// tx. id is the caller's choice (for example the order id), or empty for a
// new UUID.
//
// Starting is idempotent by id: if a saga with this id exists with the same
// type, version and start data, StartTx changes nothing and returns it (its
// current state); with anything else it returns an error wrapping
// ErrAlreadyStarted. def need not be registered with o to start a saga, but
// some orchestrator sharing the schema must have it registered to run it.
//
// Options: StartAt schedules the start for later (the saga is
// StatusScheduled until then, and nothing runs in tx but its row).
func StartTx[D any](ctx context.Context, tx pgx.Tx, o *Orchestrator, def *Definition[D], id string, data D, opts ...StartOption) (*Instance, error) {
	if def == nil {
		return nil, fmt.Errorf("saga: StartTx: nil definition")
	}
	d := def.def
	if id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, err
		}
		id = u.String()
	} else if err := checkName(id); err != nil {
		return nil, fmt.Errorf("%w %q: %v", ErrInvalidID, id, err)
	}
	raw, err := json.Marshal(data)
	if err == nil {
		err = checkStorable(raw)
	}
	if err != nil {
		return nil, fmt.Errorf("saga %s: encode data: %w", id, err)
	}
	return o.start(ctx, tx, d, id, raw, startOpts(opts))
}

// start starts a saga of d with its data, encoded: StartTx past its
// checks, and a child step's start of its child saga (child.go).
func (o *Orchestrator) start(ctx context.Context, tx pgx.Tx, d *def, id string, raw []byte, so startOptions) (*Instance, error) {
	ctx, span := startTransition(ctx, "start", id, "", nil) // tracing.go
	defer span.End(nil)
	attrs, err := o.startAttrs(ctx, tx, d, id, raw) // attr.go: ErrKeyTaken before any write
	if err != nil {
		return nil, err
	}
	now := o.clock.Now()
	if at := so.at; at.After(now) {
		return o.schedule(ctx, tx, d, id, raw, at, now, attrs) // schedule.go
	}
	in := &Instance{ID: id, Type: d.typ, Version: d.version, Status: StatusRunning, Phase: PhaseForward,
		Steps: map[string]*StepState{}, Data: raw, Input: raw, Revision: 1, CreatedAt: now, UpdatedAt: now, Parent: so.parent}
	if d.deadline > 0 {
		dl := now.Add(d.deadline)
		in.DeadlineAt = &dl
	}
	if d.startsRemote() {
		// No local step runs at the start: the first state is computed
		// here and inserted with its history in one round trip.
		m := &machine{o: o, d: d, in: in, ctx: ctx, tx: tx, now: now}
		m.record("started", "", "", 0, "", "")
		if err := m.advance(0); err != nil {
			return nil, err
		}
		in.NextWakeupAt = m.nextWakeup()
		steps, err := encodeSteps(in.Steps)
		if err != nil {
			return nil, fmt.Errorf("saga %s: encode step state: %w", id, err)
		}
		args := append([]any{id, d.typ, d.version, in.Status, in.Phase, in.Step, steps, raw, in.NextWakeupAt, in.DeadlineAt,
			in.Attempts, oneLine(in.LastError), now}, historyArgs(m.hist)...)
		var inserted int
		if err := tx.QueryRow(ctx, o.sql.insertStarted, args...).Scan(&inserted); err != nil {
			return nil, fmt.Errorf("saga %s: insert: %w", id, o.tablesError(err))
		}
		if inserted == 1 {
			if err := o.setParent(ctx, tx, in); err != nil { // child.go
				return nil, err
			}
			if before := o.startAttrStatement(in, attrs); len(m.events) > 0 || before != nil { // attr.go
				// In Start's transaction, the writes go with the COMMIT.
				err := pipeline.WriteLast(ctx, tx, before, fmt.Sprintf("saga %s: write commands", id), func(wtx pgx.Tx) error {
					if len(m.events) == 0 {
						return nil
					}
					_, err := o.writer.WriteTx(ctx, wtx, m.events...)
					return err
				})
				if err != nil {
					return nil, fmt.Errorf("saga %s: write commands: %w", id, err)
				}
			}
			o.countStart(d, m)
			return in, nil
		}
		return o.existing(ctx, tx, d, id, raw)
	}
	tag, err := tx.Exec(ctx, o.sql.insert, id, d.typ, d.version, raw, in.DeadlineAt, now)
	if err != nil {
		return nil, fmt.Errorf("saga %s: insert: %w", id, o.tablesError(err))
	}
	if tag.RowsAffected() == 0 {
		return o.existing(ctx, tx, d, id, raw)
	}
	if err := o.setParent(ctx, tx, in); err != nil { // child.go
		return nil, err
	}
	in.Revision = 0 // as inserted; saving its first state makes it 1
	if err := o.writeStartAttrs(ctx, tx, in, attrs); err != nil {
		return nil, err
	}
	m := &machine{o: o, d: d, in: in, ctx: ctx, tx: tx, now: now, applied: true}
	m.record("started", "", "", 0, "", "")
	if err := m.advance(0); err != nil {
		return nil, err
	}
	if err := m.save(); err != nil {
		return nil, err
	}
	o.countStart(d, m)
	return in, nil
}

func (o *Orchestrator) countStart(d *def, m *machine) {
	if mt := o.metrics; mt != nil {
		mt.started.WithLabelValues(d.typ).Inc()
		for _, f := range m.after {
			f()
		}
	}
}

// existing returns the saga id of a repeated start, or ErrAlreadyStarted.
func (o *Orchestrator) existing(ctx context.Context, tx pgx.Tx, d *def, id string, raw []byte) (*Instance, error) {
	var typ string
	var version int
	var same bool
	if err := tx.QueryRow(ctx, o.sql.selectExisting, id, raw).Scan(&typ, &version, &same); err != nil {
		return nil, fmt.Errorf("saga %s: read existing: %w", id, err)
	}
	if typ != d.typ || version != d.version || !same {
		return nil, fmt.Errorf("%w: saga %q exists as %s v%d (starting %s v%d, same data: %t)", ErrAlreadyStarted, id, typ, version, d.typ, d.version, same)
	}
	existing, err := scanInstance(tx.QueryRow(ctx, o.sql.get, id))
	if err != nil {
		return nil, fmt.Errorf("saga %s: read existing: %w", id, err)
	}
	existing.Existing = true
	return existing, nil
}
