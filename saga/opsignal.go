package saga

import (
	"context"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/audit"
)

// actionSignal names an operator's event (Orchestrator.Signal) in the
// history and the audit trail ("saga.signal"); it is not an Action an
// Operator request or a bulk operation takes.
const actionSignal = "signal"

// Signal delivers an event to a saga as an operator action, when the
// sender is gone (a webhook lost, a payment confirmed by phone): t names
// the saga by id (SagaID) or by correlation key (Type, Key and Value, as
// SignalByKeyTx), the event and its id (a new one when empty; a repeated
// delivery with the same id applies once); payload is SignalTx's. It
// applies the event with SignalTx's guarantees, in a transaction of its
// own, in which by (who and why, both required) is recorded in each
// reached saga's history (an "operator" line) and in the audit trail
// ("saga.signal", done or refused, with the event's name and id, never
// its payload).
//
// It is refused with Signal's and SignalByKey's typed errors: ErrNotFound
// for an unknown saga, ErrInvalidEvent, and ErrSagaEnded,
// ErrEventNotAwaited or ErrKeyNotHeld, whose refusal is committed,
// recorded and audited as refused; ErrActionNotAllowed for an incomplete
// Actor or, by id with by.Revision set, a saga that changed since the
// operator looked at it (stale). By id it waits for the orchestrator's
// lock on the saga, and applies the event at once.
//
// It needs no definition: an Orchestrator without the saga's definition
// registered (the millrace command, a console without the service's
// definitions) stores the event for the service's running orchestrator,
// whose next pass (Run, RunDue) applies it as it applies any event stored
// while it held the saga; an event no step of the saga waits for is then
// refused in the saga's history only.
func (o *Orchestrator) Signal(ctx context.Context, t EventTarget, payload any, by Actor) error {
	if err := noActor(by); err != nil {
		return fmt.Errorf("%w: signal of event %q: %w", ErrActionNotAllowed, t.Event, err)
	}
	if (t.SagaID == "") == (t.Key == "") {
		return fmt.Errorf("%w: signal: set the saga id, or the saga type, key and value, not both", ErrInvalidEvent)
	}
	var after []func()
	err := o.refusalCommits(ctx, func(tx pgx.Tx) error { // signal.go
		var err error
		after, err = o.signalAs(ctx, tx, t, payload, by)
		return err
	})
	if err == nil || isRefusal(err) { // committed
		for _, f := range after {
			f()
		}
	}
	return err
}

// signalAs is Signal in tx. It returns the refusal (recorded) or the
// failure, and what to run once tx commits.
func (o *Orchestrator) signalAs(ctx context.Context, tx pgx.Tx, t EventTarget, payload any, by Actor) ([]func(), error) {
	eventID, raw, err := checkEvent(t.Event, t.EventID, payload)
	if err != nil {
		return nil, err
	}
	v := via{typ: t.Type, name: t.Key, value: t.Value, file: true}
	types := map[string]string{}
	var ids []string
	var sent error
	var refused map[string]error // by key: the sagas that refused it, when others took it
	if t.Key == "" {
		in, err := o.lock(ctx, tx, t.SagaID)
		if err != nil {
			return nil, err
		}
		if err := seen(in, actionSignal, by); err != nil {
			return nil, err
		}
		ids, types[in.ID] = []string{in.ID}, in.Type
		sent = o.signalOne(ctx, tx, in.ID, t.Event, eventID, raw, v) // signal.go
	} else {
		for _, f := range []string{t.Type, t.Key, t.Value} {
			if err := checkName(f); err != nil {
				return nil, fmt.Errorf("%w: signal by key: saga type, key name and value: %q: %v", ErrInvalidEvent, f, err)
			}
		}
		ids, refused, sent = o.signalByKey(ctx, tx, v, t.Event, eventID, raw) // keysignal.go
	}
	if sent != nil && !isRefusal(sent) {
		return nil, sent
	}
	entries, hist := o.signalRecords(t, eventID, ids, types, by, sent, refused)
	if err := o.writeHistory(ctx, tx, hist); err != nil {
		return nil, err
	}
	if err := o.trail.Write(ctx, tx, entries...); err != nil {
		return nil, fmt.Errorf("saga: signal: %w", err)
	}
	return []func(){func() {
		for _, e := range entries {
			audit.Count(e)
		}
	}}, sent
}

// signalRecords are an operator's event's history lines (one per saga it
// reached) and audit entries (one per saga, or one for the key no saga
// held), done or refused by sent; a saga in refused (by key, when another
// took the event) is audited as refused with its own refusal.
func (o *Orchestrator) signalRecords(t EventTarget, eventID string, ids []string, types map[string]string, by Actor, sent error, refused map[string]error) ([]audit.Entry, []historyRow) {
	outcome := audit.Done
	detail := map[string]string{"event": t.Event, "event_id": eventID}
	if t.Key != "" {
		detail["key"], detail["value"] = t.Key, t.Value
	}
	if sent != nil {
		outcome, detail["error"] = audit.Refused, sent.Error()
	}
	now := o.clock.Now()
	var entries []audit.Entry
	var hist []historyRow
	for _, id := range ids {
		typ := types[id]
		if typ == "" {
			typ = t.Type
		}
		out, det := outcome, detail
		if err, ok := refused[id]; ok && sent == nil {
			out, det = audit.Refused, maps.Clone(detail)
			det["error"] = err.Error()
		}
		entries = append(entries, audit.Entry{Actor: by, Action: "saga." + actionSignal, Outcome: out, Kind: audit.KindSaga,
			Scope: typ, Target: id, Detail: det})
		hist = append(hist, historyRow{sagaID: id, at: now, event: "operator", actor: by.Operator, reason: by.Reason,
			detail: operatorDetail(actionSignal, by)})
	}
	if len(ids) == 0 { // no saga held the key
		entries = append(entries, audit.Entry{Actor: by, Action: "saga." + actionSignal, Outcome: outcome, Kind: audit.KindSaga,
			Scope: t.Type, Detail: detail})
	}
	return entries, hist
}
