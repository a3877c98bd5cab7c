package saga

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
)

// via is how an event is sent: by key (typ, name and value, as saga_event
// records them in key_type, key_name and key_value; empty for an event sent
// by saga id), and whether it is filed for the orchestrator that has the
// saga's definition when this one lacks it (an operator's tool:
// Orchestrator.Signal).
type via struct {
	typ, name, value string
	file             bool
}

// SignalByKey delivers an event to the running sagas of type sagaType
// that hold key keyName = value, in a transaction of its own; see
// SignalByKeyTx. A refused event (ErrKeyNotHeld, ErrSagaEnded,
// ErrEventNotAwaited) is still committed as a record before the error is
// returned.
func SignalByKey(ctx context.Context, o *Orchestrator, sagaType, keyName, value, event, eventID string, payload any) error {
	return o.refusalCommits(ctx, func(tx pgx.Tx) error { // signal.go
		return SignalByKeyTx(ctx, tx, o, sagaType, keyName, value, event, eventID, payload)
	})
}

// isRefusal reports whether err is an event's refusal, which is recorded
// (and committed by Signal and SignalByKey).
func isRefusal(err error) bool {
	return errors.Is(err, ErrSagaEnded) || errors.Is(err, ErrEventNotAwaited) || errors.Is(err, ErrKeyNotHeld)
}

// SignalByKeyTx delivers event with payload, in the caller's transaction,
// to every running saga of type sagaType that holds correlation key
// keyName (Spec.Keys) with value: for a unique key at most one, for a
// shared key each of them, in saga id order. Each delivery is SignalTx's,
// with its guarantees: it never waits for the orchestrator, an event that
// comes before its wait is stored and applied when the saga gets there,
// and a repeated delivery (the same eventID) applies once per saga. The
// stored event (table saga_event) records the key it came by. A saga
// holds its keys from its start (in the start's transaction) until it ends
// (completed or compensated; a stuck, paused or scheduled saga holds
// them).
//
// When no running saga of the type holds the value, the event is stored as
// refused with an empty saga_id and the key (retention removes it after the
// Compensated window), and the error wraps ErrKeyNotHeld; a repeated
// delivery of an event a saga took before it ended returns nil, as
// SignalTx does. When every saga holding it refuses it, the error joins
// their refusals (ErrSagaEnded, ErrEventNotAwaited, each recorded in its
// saga's history); when one took it, nil. sagaType, keyName and value
// must be non-empty, at most 200 bytes of UTF-8 without NUL
// (ErrInvalidEvent); the other arguments are SignalTx's.
func SignalByKeyTx(ctx context.Context, tx pgx.Tx, o *Orchestrator, sagaType, keyName, value, event, eventID string, payload any) error {
	if o == nil || tx == nil {
		return fmt.Errorf("%w: saga.SignalByKeyTx: nil Orchestrator or transaction", core.ErrConfig)
	}
	for _, f := range []struct{ what, v string }{{"saga type", sagaType}, {"key name", keyName}, {"key value", value}} {
		if err := checkName(f.v); err != nil {
			return fmt.Errorf("%w: %s %q: %v", ErrInvalidEvent, f.what, f.v, err)
		}
	}
	eventID, raw, err := checkEvent(event, eventID, payload)
	if err != nil {
		return fmt.Errorf("saga %s %s = %q: %w", sagaType, keyName, value, err)
	}
	_, _, err = o.signalByKey(ctx, tx, via{typ: sagaType, name: keyName, value: value}, event, eventID, raw)
	return err
}

// signalByKey is SignalByKeyTx after its checks. It returns the sagas
// that held the key.
func (o *Orchestrator) signalByKey(ctx context.Context, tx pgx.Tx, v via, event, eventID string, raw []byte) (ids []string, refused map[string]error, err error) {
	rows, err := tx.Query(ctx, o.sql.attr.holders, v.typ, v.name, v.value)
	if err != nil {
		return nil, nil, fmt.Errorf("saga: find the sagas holding %s %s = %q: %w", v.typ, v.name, v.value, o.tablesError(err))
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("saga: find the sagas holding %s %s = %q: %w", v.typ, v.name, v.value, err)
	}
	if len(ids) == 0 {
		return nil, nil, o.keyNotHeld(ctx, tx, v, event, eventID, raw)
	}
	var refusals []error
	for _, id := range ids {
		err := o.signalOne(ctx, tx, id, event, eventID, raw, v) // signal.go
		switch {
		case isRefusal(err) || errors.Is(err, ErrNotFound): // ended, or removed, since it was found
			refusals = append(refusals, err)
			if refused == nil {
				refused = map[string]error{}
			}
			refused[id] = err
		case err != nil:
			return ids, refused, err
		}
	}
	if len(refusals) == len(ids) {
		return ids, refused, errors.Join(refusals...)
	}
	return ids, refused, nil
}

// keyNotHeld stores an event sent by key that no running saga holds as
// refused, with an empty saga_id, and returns its refusal; or nil for a repeated
// delivery of an event a saga holding the key took before it ended.
func (o *Orchestrator) keyNotHeld(ctx context.Context, tx pgx.Tx, key via, event, eventID string, raw []byte) error {
	var state string
	err := tx.QueryRow(ctx, o.sql.attr.heldBefore, key.typ, key.name, key.value, eventID).Scan(&state)
	switch {
	case err == nil && state != eventRefused:
		return nil
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("saga: read event %s sent by key: %w", eventID, err)
	}
	// A repeated refused delivery is one row (saga_event_once).
	if _, err := tx.Exec(ctx, o.sql.events.insert, "", event, eventID, raw, eventRefused, o.clock.Now(), key.typ, key.name, key.value); err != nil {
		return fmt.Errorf("saga: store event %s sent by key: %w", eventID, o.tablesError(err))
	}
	return fmt.Errorf("%w: no running saga of type %s holds %s = %q (event %s, id %s)", ErrKeyNotHeld, key.typ, key.name, key.value, event, eventID)
}
