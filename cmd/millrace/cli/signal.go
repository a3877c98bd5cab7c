package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/saga"
)

// signalJSON is the JSON shape of saga signal: the event sent, where to,
// and the saga as it is after (by id).
type signalJSON struct {
	Event   string    `json:"event"`
	EventID string    `json:"event_id"`
	SagaID  string    `json:"saga_id,omitempty"`
	Type    string    `json:"type,omitempty"`
	Key     string    `json:"key,omitempty"`
	Value   string    `json:"value,omitempty"`
	Saga    *sagaJSON `json:"saga,omitempty"`
}

func (a *app) sagaSignalCmd() *cobra.Command {
	var w *who
	var payload, eventID, key, typ string
	cmd := &cobra.Command{
		Use:   "signal [ID] EVENT --reason TEXT [--payload JSON] [--event-id ID] [--key NAME=VALUE --type TYPE]",
		Short: "Send an event to a saga waiting for it (a lost webhook, a payment confirmed by phone)",
		Long: "Send an event to a saga, by its id or (--key name=value --type T, and no ID) to the running sagas of the\n" +
			"type holding that correlation key, as the service's own signal would: applied once per event id (--event-id,\n" +
			"printed when generated: repeat it to retry safely), stored if the saga has not reached its wait yet, and\n" +
			"refused when the saga has ended, no step waits for the event, or no running saga holds the key. The\n" +
			"operator (--operator, default $USER) and the reason are recorded in the saga's history and the audit trail.\n" +
			"The stock binary has no definitions: the event is stored for the service's running orchestrator, which\n" +
			"applies it on its next pass.",
		Args: args(cobra.RangeArgs(1, 2)),
		RunE: func(cmd *cobra.Command, pos []string) error {
			t := saga.EventTarget{Event: pos[len(pos)-1], EventID: eventID}
			res := console.Resource{Kind: "saga", Op: "signal"}
			switch {
			case key != "" && len(pos) == 1:
				name, value, ok := strings.Cut(key, "=")
				if !ok || typ == "" {
					return usagef("--key wants name=value, with --type")
				}
				t.Type, t.Key, t.Value, res.Type = typ, name, value, typ
			case key == "" && len(pos) == 2:
				t.SagaID, res.ID = pos[0], pos[0]
			default:
				return usagef("give the saga's ID and the EVENT, or the EVENT with --key name=value --type TYPE")
			}
			raw := json.RawMessage(payload)
			if payload != "" && !json.Valid(raw) {
				return usagef("--payload is not JSON")
			}
			if t.EventID == "" {
				t.EventID = uuid.NewString()
			}
			by, err := a.actor(w, "the event "+t.Event)
			if err != nil {
				return err
			}
			if err := a.authorize(cmd, by, "act", res); err != nil {
				return err
			}
			o, err := a.orchestrator(cmd.Context())
			if err != nil {
				return err
			}
			if err := o.Signal(cmd.Context(), t, raw, by); err != nil {
				return err
			}
			out := signalJSON{Event: t.Event, EventID: t.EventID, SagaID: t.SagaID, Type: t.Type, Key: t.Key, Value: t.Value}
			if t.SagaID != "" {
				in, err := o.Get(cmd.Context(), t.SagaID)
				if err != nil {
					return err
				}
				s := a.toJSON(in)
				out.Saga = &s
			}
			return a.emit(out, func(w io.Writer) {
				to := "saga " + t.SagaID
				if t.Key != "" {
					to = fmt.Sprintf("the running %s sagas holding %s=%s", t.Type, t.Key, t.Value)
				}
				fmt.Fprintf(w, "event %s (id %s) sent to %s by %s", t.Event, t.EventID, to, by.Operator)
				if out.Saga != nil {
					fmt.Fprintf(w, ": now %s", out.Saga.Status)
					if out.Saga.Step != "" {
						fmt.Fprintf(w, " at step %s", out.Saga.Step)
					}
				}
				fmt.Fprintln(w)
			})
		},
	}
	w = addWho(cmd)
	f := cmd.Flags()
	f.StringVar(&payload, "payload", "", "the event's payload, JSON (default null)")
	f.StringVar(&eventID, "event-id", "", "the event's id: a second event with the same id changes nothing (default a new UUID, printed)")
	f.StringVar(&key, "key", "", "send by correlation key name=value (with --type), not by saga id")
	f.StringVar(&typ, "type", "", "the saga type, with --key")
	return cmd
}
