package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sagahook"
)

// Errors of Signal, SignalTx and EventHandler.
var (
	// ErrSagaEnded: the event is for a saga that has ended (completed or
	// compensated). The event is stored as refused and recorded in the
	// saga's history.
	ErrSagaEnded = errors.New("saga: the saga has ended")
	// ErrEventNotAwaited: no step of the saga's definition waits for an
	// event of this name. The event is stored as refused and recorded in
	// the saga's history.
	ErrEventNotAwaited = errors.New("saga: no step waits for this event")
	// ErrInvalidEvent: an event name or id that is empty, longer than 200
	// bytes, not valid UTF-8 or holds NUL, or a payload that is not JSON.
	ErrInvalidEvent = errors.New("saga: invalid event")
)

// Signal delivers an event to a saga in a transaction of its own; see
// SignalTx. A refused event (ErrSagaEnded, ErrEventNotAwaited) is still
// committed as a record before the error is returned.
func Signal(ctx context.Context, o *Orchestrator, sagaID, event, eventID string, payload any) error {
	return o.refusalCommits(ctx, func(tx pgx.Tx) error { return SignalTx(ctx, tx, o, sagaID, event, eventID, payload) })
}

// refusalCommits runs fn in a transaction of its own, which commits when
// fn succeeds or an event is refused (isRefusal: the refusal's record
// commits), and returns fn's error.
func (o *Orchestrator) refusalCommits(ctx context.Context, fn func(tx pgx.Tx) error) error {
	var refused error
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		refused = nil
		err := fn(tx)
		if isRefusal(err) {
			refused = err
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	return refused
}

// SignalTx delivers event (a name some wait step of the saga's definition
// waits for, see Await) with payload to saga sagaID in the caller's
// transaction: the event is stored (table saga_event) and applied with the
// caller's own changes, or not at all. eventID identifies the delivery: a
// second delivery with the same id changes nothing, so a webhook retried
// by its sender applies once; it returns nil when the first was taken
// (applied or filed), and the first one's refusal again (ErrSagaEnded,
// ErrEventNotAwaited) when the first was refused. An empty eventID is a new
// UUID (no deduplication). payload is encoded with encoding/json (a
// json.RawMessage is taken as it is and must be JSON); a NUL escape, a
// lone UTF-16 surrogate escape or invalid UTF-8 in it becomes U+FFFD, as
// PostgreSQL's jsonb cannot hold them, and a number jsonb cannot hold
// (1e999999) is refused with ErrInvalidEvent before any statement runs in
// tx.
//
// The saga's definition must be registered with o. An event for a saga
// that has ended returns an error wrapping ErrSagaEnded; a name no step of
// its definition waits for, ErrEventNotAwaited; either is stored as
// refused and recorded in the saga's history, in tx (Signal commits that
// record; with SignalTx, commit tx to keep it). An unknown saga returns
// ErrNotFound.
//
// SignalTx never waits for the orchestrator. If the saga's row is free, it
// locks it (FOR NO KEY UPDATE SKIP LOCKED) and applies the event at once in tx:
// when the saga waits for it, its step's OnEvent runs and the saga moves on
// (the next commands commit with tx); when it has not reached the wait yet,
// the event is stored as pending and consumed, in order of arrival, when
// the saga gets there; when the wait is over (the first of an any-of wait
// won, it timed out) it is recorded and ignored. A wait whose timeout (or
// the saga's deadline) has passed by the event's arrival is timed out
// first, as the timer pass would have, even if none has run yet: a late
// event never wins over a timeout. The row stays locked until
// tx ends, so keep tx short. If the orchestrator holds the row (it is
// applying a reply, or entering the wait), the event is stored as new and
// the orchestrator's timer pass (Run, RunDue) applies it the same way, in
// order of arrival, within a PollInterval: an event committed while the
// saga is being advanced into its wait is never missed. In that case an
// event found refused by then (the saga ended meanwhile) is recorded in the
// history only.
func SignalTx(ctx context.Context, tx pgx.Tx, o *Orchestrator, sagaID, event, eventID string, payload any) error {
	if o == nil || tx == nil {
		return fmt.Errorf("%w: saga.SignalTx: nil Orchestrator or transaction", core.ErrConfig)
	}
	if err := checkName(sagaID); err != nil {
		return fmt.Errorf("%w %q: %v", ErrInvalidID, sagaID, err)
	}
	eventID, raw, err := checkEvent(event, eventID, payload)
	if err != nil {
		return fmt.Errorf("saga %s: %w", sagaID, err)
	}
	return o.signalOne(ctx, tx, sagaID, event, eventID, raw, via{})
}

// signalOne is SignalTx after its checks, in a span of its own.
func (o *Orchestrator) signalOne(ctx context.Context, tx pgx.Tx, sagaID, event, eventID string, raw []byte, v via) error {
	ctx, span := startTransition(ctx, "event", sagaID, "", nil) // tracing.go
	after, err := o.signal(ctx, tx, sagaID, event, eventID, raw, v)
	span.End(err)
	for _, f := range after {
		f()
	}
	return err
}

// checkEvent checks an event's name and id (a new UUID when empty) and
// encodes its payload (eventPayload), or returns an error wrapping
// ErrInvalidEvent.
func checkEvent(event, eventID string, payload any) (string, []byte, error) {
	if err := checkName(event); err != nil {
		return "", nil, fmt.Errorf("%w: name %q: %v", ErrInvalidEvent, event, err)
	}
	if eventID == "" {
		eventID = uuid.NewString()
	} else if err := checkName(eventID); err != nil {
		return "", nil, fmt.Errorf("%w: id %q: %v", ErrInvalidEvent, eventID, err)
	}
	raw, err := eventPayload(payload)
	if err != nil {
		return "", nil, fmt.Errorf("%w: event %s: payload: %v", ErrInvalidEvent, event, err)
	}
	return eventID, raw, nil
}

// eventPayload encodes an event's payload as JSON that jsonb can store.
func eventPayload(payload any) ([]byte, error) {
	var raw []byte
	switch p := payload.(type) {
	case json.RawMessage:
		raw = p
		if len(raw) == 0 {
			raw = []byte("null")
		}
		if !json.Valid(raw) {
			return nil, errors.New("not JSON")
		}
	default:
		var err error
		if raw, err = json.Marshal(payload); err != nil {
			return nil, err
		}
	}
	raw = storable(raw)
	if err := checkStorable(raw); err != nil {
		return nil, err // a number numeric cannot hold: no replacement keeps its meaning
	}
	return raw, nil
}

// signal stores and applies one event for saga sagaID (SignalTx), sent by
// a key when v has one (SignalByKeyTx). With v.file, a saga whose
// definition o lacks has the event stored for the orchestrator that has it.
func (o *Orchestrator) signal(ctx context.Context, tx pgx.Tx, sagaID, event, eventID string, raw []byte, v via) ([]func(), error) {
	now := o.clock.Now()
	in, err := scanInstance(tx.QueryRow(ctx, o.sql.events.tryLock, sagaID))
	locked := err == nil
	var (
		typ     string
		version int
		status  Status
	)
	switch {
	case locked:
		typ, version, status = in.Type, in.Version, in.Status
	case errors.Is(err, pgx.ErrNoRows):
		// Locked by someone else, or no such saga: read what is committed.
		err := tx.QueryRow(ctx, o.sql.events.peek, sagaID).Scan(&typ, &version, &status)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("%w: %q", ErrNotFound, sagaID)
		}
		if err != nil {
			return nil, fmt.Errorf("saga %s: read: %w", sagaID, o.tablesError(err))
		}
	default:
		return nil, fmt.Errorf("saga %s: lock: %w", sagaID, o.tablesError(err))
	}
	d := o.definition(typ, version)
	if d == nil && !v.file {
		return nil, fmt.Errorf("%w: saga %s is %s v%d", ErrNotRegistered, sagaID, typ, version)
	}
	refuse := func(cause error, reason string) ([]func(), error) {
		refusal := fmt.Errorf("%w: saga %s, event %s (id %s): %s", cause, sagaID, event, eventID, reason)
		ev := storedEvent{name: event, id: eventID, payload: raw, at: now}
		err := tx.QueryRow(ctx, o.sql.events.insert, sagaID, event, eventID, raw, eventRefused, now, v.typ, v.name, v.value).Scan(&ev.arrived)
		if errors.Is(err, pgx.ErrNoRows) {
			// A repeated delivery: nil if the first was taken (the saga
			// ended since), the refusal again, unrecorded, if it was not.
			var state string
			if err := tx.QueryRow(ctx, o.sql.events.stateOf, sagaID, eventID).Scan(&state); err != nil {
				return nil, fmt.Errorf("saga %s: read event %s: %w", sagaID, eventID, err)
			}
			if state != eventRefused {
				return nil, nil
			}
			return nil, refusal
		}
		if err != nil {
			return nil, fmt.Errorf("saga %s: store event %s: %w", sagaID, eventID, o.tablesError(err))
		}
		if err := o.writeHistory(ctx, tx, []historyRow{eventHistory(sagaID, now, string(status), ev, eventRefused, "", reason)}); err != nil {
			return nil, err
		}
		return nil, refusal
	}
	if d != nil && !d.waitsFor(0, event) {
		return refuse(ErrEventNotAwaited, fmt.Sprintf("no step of %s v%d waits for it", typ, version))
	}
	if status == StatusCompleted || status == StatusCompensated {
		return refuse(ErrSagaEnded, "the saga is "+string(status))
	}
	var arrived int64
	err = tx.QueryRow(ctx, o.sql.events.insert, sagaID, event, eventID, raw, eventNew, now, v.typ, v.name, v.value).Scan(&arrived)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil // a duplicate delivery: applied (or filed) once already
	}
	if err != nil {
		return nil, fmt.Errorf("saga %s: store event %s: %w", sagaID, eventID, o.tablesError(err))
	}
	if !locked || d == nil {
		return nil, nil // the orchestrator's timer pass applies it
	}
	if status == StatusPaused || status == StatusScheduled {
		// Stored: Resume, or the saga's start, takes it. Its history line
		// says so now, with its arrival.
		why := "stored until the saga is resumed"
		if status == StatusScheduled {
			why = "stored until the saga starts"
		}
		ev := storedEvent{arrived: arrived, name: event, id: eventID, at: now}
		return nil, o.writeHistory(ctx, tx, []historyRow{eventHistory(sagaID, now, string(status), ev, eventHeld, "", why)})
	}
	if err := o.callHook(ctx, sagahook.Loaded, sagaID); err != nil {
		return nil, err
	}
	m := &machine{o: o, d: d, in: in, ctx: ctx, tx: tx, now: now}
	if err := m.onNewEvents(); err != nil {
		return nil, err
	}
	if err := m.save(); err != nil {
		return nil, err
	}
	return m.after, o.callHook(ctx, sagahook.BeforeCommit, sagaID)
}

// applyEvents applies the events a signaller stored without applying them
// (it found the saga locked), for at most ClaimBatch sagas of the
// registered types, each under a savepoint of its own. A saga whose events
// fail technically is rolled back alone and handled as a failing timer
// (timerFailed: a "timer_failed" line, its next try after a backoff, by
// the timer pass, parked as stuck after MaxTimerFailures). RunDue calls
// it.
func (o *Orchestrator) applyEvents(ctx context.Context) (int, error) {
	types, versions := o.registeredPairs()
	if len(types) == 0 {
		return 0, nil
	}
	var woken [][]func()
	var failed error
	err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
		woken, failed = woken[:0], nil
		// Relies on saga_event_new_idx.
		found, err := queryInstances(ctx, tx, o.sql.events.claimNew, types, versions, o.batch)
		if err != nil {
			return fmt.Errorf("saga: claim sagas with new events: %w", o.tablesError(err))
		}
		now := o.clock.Now()
		for _, in := range found {
			d := o.definition(in.Type, in.Version)
			if d == nil {
				continue
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return fmt.Errorf("saga %s: savepoint: %w", in.ID, err)
			}
			claimed := *in // as read: the machine changes in
			m := &machine{o: o, d: d, in: in, ctx: ctx, tx: sp, now: now}
			err = m.applyNewEvents()
			if err == nil {
				if err := sp.Commit(ctx); err != nil {
					return fmt.Errorf("saga %s: release savepoint: %w", in.ID, err)
				}
				woken = append(woken, m.after)
				continue
			}
			if rerr := sp.Rollback(ctx); rerr != nil || ctx.Err() != nil {
				return errors.Join(err, rerr)
			}
			err = fmt.Errorf("saga %s: apply new events: %w", in.ID, err)
			parked, after, ferr := o.timerFailed(ctx, tx, &claimed, now, err) // timer.go
			if ferr != nil {
				return errors.Join(err, ferr)
			}
			failed = errors.Join(failed, skipped{err})
			if parked {
				woken = append(woken, after)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, after := range woken {
		for _, f := range after {
			f()
		}
	}
	return len(woken), failed
}

// applyNewEvents applies m's new events and saves the saga. A panic is
// returned as a panicked error (timer.go).
func (m *machine) applyNewEvents() (err error) {
	defer recoverPanic(&err)
	if err := m.o.callHook(m.ctx, sagahook.Loaded, m.in.ID); err != nil {
		return err
	}
	if err := m.onNewEvents(); err != nil {
		return err
	}
	if err := m.save(); err != nil {
		return err
	}
	return m.o.callHook(m.ctx, sagahook.BeforeCommit, m.in.ID)
}

// EventTarget is where a message delivers its event: the saga, the event's
// name and its id (deduplicated per saga; defaults to the message's UUID).
// With Key set, the event goes by correlation key instead of SagaID: to
// the running sagas of type Type holding Key = Value (SignalByKeyTx).
type EventTarget struct {
	SagaID, Event, EventID string
	// Type, Key and Value address the event by key (all three, and no
	// SagaID).
	Type, Key, Value string
}

// EventHandler returns a Watermill handler that delivers each message of
// a topic as an event, as SignalTx does, with the message's payload (JSON)
// as the event's. route maps a message to its saga and event name (from
// its metadata or payload); an error it returns is the handler's (wrap it
// with core.Permanent for a message that will never map); it may address
// the event by a correlation key instead of a saga id (EventTarget.Key,
// as SignalByKeyTx; no saga holding it is a refusal, ErrKeyNotHeld).
// Each message is applied in one transaction: the one in its context (core.TxFromContext,
// as the inbox's middleware puts it there), or one of its own. It is
// deduplicated by its event, not by the message: a redelivery (the same
// saga and event id) applies once, and a message copied to several topics
// applies once per saga it is routed to, whichever handlers read those
// topics (it records no inbox mark of its own, so it shares none with the
// reply handler). An event the saga refuses (ErrSagaEnded,
// ErrEventNotAwaited, ErrKeyNotHeld) is recorded, logged and acknowledged;
// an unknown saga, an invalid event or a payload jsonb cannot hold is a
// core.Permanent error (ErrNotFound, ErrInvalidEvent). Put it behind
// Watermill's PoisonQueue and Retry (with inbox.ShouldRetry) middleware,
// as any inbox handler.
func (o *Orchestrator) EventHandler(route func(msg *message.Message) (EventTarget, error)) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		t, err := route(msg)
		if err != nil {
			return fmt.Errorf("saga: EventHandler: route message %s: %w", msg.UUID, err)
		}
		if t.EventID == "" {
			t.EventID = msg.UUID
		}
		if len(msg.Payload) > 0 && !json.Valid(msg.Payload) {
			return core.Permanent(fmt.Errorf("%w: message %s: payload is not JSON", ErrInvalidEvent, msg.UUID))
		}
		ctx := msg.Context()
		signal := func(tx pgx.Tx) error {
			var err error
			if t.Key != "" {
				err = SignalByKeyTx(ctx, tx, o, t.Type, t.Key, t.Value, t.Event, t.EventID, json.RawMessage(msg.Payload)) // keysignal.go
			} else {
				err = SignalTx(ctx, tx, o, t.SagaID, t.Event, t.EventID, json.RawMessage(msg.Payload))
			}
			switch {
			case isRefusal(err):
				o.logger.Info("saga: event refused", map[string]any{"saga_id": t.SagaID, "key": t.Key, "value": t.Value, "event": t.Event, "event_id": t.EventID, "error": err.Error()})
				return nil // its record commits
			case errors.Is(err, ErrNotFound) || errors.Is(err, ErrInvalidEvent) || errors.Is(err, ErrInvalidID) || errors.Is(err, ErrNotRegistered):
				return core.Permanent(err)
			}
			return err
		}
		if tx, ok := core.TxFromContext(ctx); ok {
			return signal(tx)
		}
		return pgx.BeginFunc(ctx, o.pool, signal)
	}
}
