package sagatest

import (
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// The headers SendEvent puts on an event's message, which AddEvents's
// default route reads (with core.MetadataSagaID, "saga_id", for the saga):
// "saga_event", the event's name, and "saga_event_id", its id.
const (
	headerEvent   = "saga_event"
	headerEventID = "saga_event_id"
)

// AddEvents subscribes the orchestrator's EventHandler (the one running,
// across restarts) to topic: each message there delivers an event to a
// saga, as in a service. route maps a message to its
// saga (or a correlation key: saga.EventTarget's Type, Key and Value) and
// event; nil reads the headers SendEvent writes. Their deliveries
// are Signal events, which faults can duplicate, delay (an event that
// comes late, after its wait timed out or the saga ended), reorder, or
// crash the orchestrator on.
func (h *H) AddEvents(topic string, route func(*message.Message) (saga.EventTarget, error)) {
	if route == nil {
		route = func(msg *message.Message) (saga.EventTarget, error) {
			return saga.EventTarget{SagaID: msg.Metadata.Get(core.MetadataSagaID), Event: msg.Metadata.Get(headerEvent),
				EventID: msg.Metadata.Get(headerEventID)}, nil
		}
	}
	h.subs[topic] = append(h.subs[topic], &subscriber{name: "saga-events", handle: func(msg *message.Message) error {
		return h.o.EventHandler(route)(msg)
	}})
}

// SendEvent writes an event for saga sagaID to topic through the outbox
// (a webhook's handler would, say), so it travels the harness's transport
// to AddEvents's handler, under the faults, when Run delivers it. Send it
// before the saga reaches its wait for an early event.
func (h *H) SendEvent(topic, sagaID, event, eventID string, payload any) error {
	raw, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(h.ctx, h.Pool(), func(tx pgx.Tx) error {
		_, err := h.Writer().WriteTx(h.ctx, tx, outbox.Event{Topic: topic, PartitionKey: sagaID, Payload: raw,
			AggregateType: "saga-event", AggregateID: sagaID, EventType: event,
			Metadata: map[string]string{core.MetadataSagaID: sagaID, headerEvent: event, headerEventID: eventID}})
		return err
	})
}

// Signal delivers an event to a saga now, with saga.Signal on the running
// orchestrator (not through the transport: no fault applies), and records
// it in the trace: for an event after the saga ended, say, once Run
// returned. It returns Signal's error (saga.ErrSagaEnded, ...).
func (h *H) Signal(sagaID, event, eventID string, payload any) error {
	err := saga.Signal(h.ctx, h.o, sagaID, event, eventID, payload)
	h.logf("signal %s %s (%s): %v", sagaID, event, eventID, err)
	return err
}

// checkEvents checks a saga's stored events: none was left unapplied
// (state new), no wait step consumed two events of one name, no child
// step took two ends of one child with the same status (but stuck: a
// child may be stuck again after a retry), and no child took two
// compensation requests.
func (h *H) checkEvents(id string) []string {
	rows, err := h.Pool().Query(h.ctx, fmt.Sprintf(`SELECT state, step, name, count(*) FROM %s
 WHERE saga_id = $1 AND (state = 'new' OR state = 'consumed')
 GROUP BY 1, 2, 3, CASE WHEN child = '' OR name <> 'child_ended' THEN '' WHEN payload->>'status' = 'stuck' THEN event_id
                        ELSE child || ' ' || (payload->>'status') END
 ORDER BY 1, 2, 3`, h.Table("saga_event")), id)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	var state, step, name string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&state, &step, &name, &n}, func() error {
		switch {
		case state == "new":
			out = append(out, fmt.Sprintf("%d event(s) %s never applied", n, name))
		case n > 1:
			out = append(out, fmt.Sprintf("step %s consumed %d events %s", step, n, name))
		}
		return nil
	})
	if err != nil {
		out = append(out, err.Error())
	}
	return out
}
