package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

func (a *app) inboxCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "inbox",
		Short: "The store-then-process inboxes",
	})
	var consumer string
	dead := group(&cobra.Command{
		Use:   "dead",
		Short: "Dead letters: messages a consumer's handler gave up on",
	})
	dead.PersistentFlags().StringVar(&consumer, "consumer", "", "the inbox's consumer name (required)")
	dead.AddCommand(a.inboxDeadListCmd(&consumer),
		a.inboxDeadActionCmd(&consumer, "requeue", "Give dead letters a fresh start: attempts back to 0, eligible at once",
			(*inbox.DeadLetters).RequeueTx),
		a.inboxDeadActionCmd(&consumer, "discard", "Give up on dead letters: marked processed without running the handler",
			(*inbox.DeadLetters).DiscardTx))
	cmd.AddCommand(dead)
	return cmd
}

func (a *app) inboxDead(ctx context.Context, consumer string) (*inbox.DeadLetters, error) {
	if consumer == "" {
		return nil, usagef("--consumer is required: the inbox's consumer name")
	}
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return inbox.NewDeadLetters(pool, inbox.DeadLetterConfig{Schema: a.schema, Consumer: consumer})
}

// inboxDeadLetter is the JSON shape of an inbox dead letter.
type inboxDeadLetter struct {
	EventID       string            `json:"event_id"`
	Consumer      string            `json:"consumer"`
	Topic         string            `json:"topic"`
	PartitionKey  string            `json:"partition_key"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	ReceivedAt    time.Time         `json:"received_at"`
	DeadAt        time.Time         `json:"dead_at"`
	Payload       json.RawMessage   `json:"payload,omitempty"`        // a JSON payload as it is
	PayloadBase64 string            `json:"payload_base64,omitempty"` // any other payload
	PayloadHidden bool              `json:"payload_hidden,omitempty"` // redacted whole (--redact, Config.Redact)
	Metadata      map[string]string `json:"metadata"`
}

func (a *app) inboxDeadListCmd(consumer *string) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a consumer's dead letters, oldest first",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usagef("--limit must be positive")
			}
			dl, err := a.inboxDead(cmd.Context(), *consumer)
			if err != nil {
				return err
			}
			list, err := dl.List(cmd.Context(), core.ListParams{Limit: limit})
			if err != nil {
				return err
			}
			out := make([]inboxDeadLetter, 0, len(list))
			for _, d := range list {
				o := inboxDeadLetter{
					EventID: d.EventID, Consumer: *consumer, Topic: d.Topic, PartitionKey: d.PartitionKey,
					Attempts: d.Attempts, LastError: d.LastError, ReceivedAt: d.ReceivedAt, DeadAt: d.DeadAt,
					Metadata: d.Metadata,
				}
				var b64 []byte
				o.Payload, b64, o.PayloadHidden = a.payload(console.Resource{Kind: "inbox", Type: *consumer, ID: d.EventID}, d.Payload,
					!json.Valid(d.Payload))
				if b64 != nil {
					o.PayloadBase64 = base64.StdEncoding.EncodeToString(b64)
				}
				out = append(out, o)
			}
			return a.emit(out, func(w io.Writer) {
				rows := make([][]string, 0, len(list))
				for _, d := range list {
					rows = append(rows, []string{d.EventID, d.Topic, d.PartitionKey, strconv.Itoa(d.Attempts),
						age(time.Since(d.DeadAt)), d.LastError})
				}
				table(w, []string{"EVENT ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD FOR", "LAST ERROR"}, rows)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 100, "most dead letters listed")
	return cmd
}

type inboxAction func(d *inbox.DeadLetters, ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error)

func (a *app) inboxDeadActionCmd(consumer *string, name, short string, act inboxAction) *cobra.Command {
	var sel *deadSelection
	var w *who
	cmd := &cobra.Command{
		Use:   name + " [EVENT_ID...] --reason TEXT",
		Short: short,
		Long: short + ".\nAll or nothing: if any id is not a dead letter of the consumer, " +
			"nothing changes and the command fails naming it.\nWithout ids, every dead letter of the consumer the selection " +
			"flags select (--topic, --key, --error, --older-than; --dry-run first to count and list them), 500 per transaction.\n" +
			"Each dead letter acted on is recorded in the audit trail, in its transaction, with the operator\n" +
			"(--operator, default $USER) and the reason (--reason, asked for on a terminal).",
		Args: args(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(ids) == 0 {
				return a.inboxDeadBulk(cmd, *consumer, name, sel, w)
			}
			if sel.set(cmd) {
				return usagef("the selection flags are for a bulk action: give event ids or the flags, not both")
			}
			ids, err := eventIDs(ids)
			if err != nil {
				return err
			}
			dl, err := a.inboxDead(cmd.Context(), *consumer)
			if err != nil {
				return err
			}
			by, err := a.actor(w, name+" of "+strconv.Itoa(len(ids))+" inbox dead letter(s)")
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := a.authorize(cmd, by, console.Action(name), console.Resource{Kind: "inbox", Type: *consumer, ID: id}); err != nil {
					return err
				}
			}
			n, err := a.allOrNothing(cmd.Context(), ids, func(tx pgx.Tx, id string) (bool, error) {
				n, err := act(dl, cmd.Context(), tx, by, id)
				return n == 1, err
			}, "a dead letter of consumer "+strconv.Quote(*consumer))
			if err != nil {
				return err
			}
			return a.emitAction(actionResult{Action: name, Consumer: *consumer, Count: n, EventIDs: ids}, "inbox dead letter")
		},
	}
	sel = addDeadSelection(cmd) // bulk.go
	w = addWho(cmd)
	return cmd
}
