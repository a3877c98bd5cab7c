package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
)

func (a *app) outboxCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "outbox",
		Short: "The outbox: backlog, dead letters, replay, CDC slot",
	})
	cmd.AddCommand(a.listing(&cobra.Command{
		Use:   "stats",
		Short: "Size of the backlog, dead letters, and age of the oldest pending event",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			s, err := admin.Stats(cmd.Context())
			if err != nil {
				return err
			}
			out := outboxStats{
				Pending: s.Pending, PendingEstimated: s.PendingEstimated, Dead: s.Dead, Blocked: s.Blocked,
				OldestPendingAgeSeconds: s.OldestPendingAge.Seconds(),
			}
			return a.emit(out, func(w io.Writer) {
				pending := strconv.FormatInt(s.Pending, 10)
				if s.PendingEstimated {
					pending = "~" + pending + " (estimate)"
				}
				table(w, []string{"PENDING", "BLOCKED", "DEAD", "OLDEST PENDING"},
					[][]string{{pending, strconv.FormatInt(s.Blocked, 10), strconv.FormatInt(s.Dead, 10), age(s.OldestPendingAge)}})
			})
		},
	}))
	dead := group(&cobra.Command{
		Use:   "dead",
		Short: "Dead letters: events the relay gave up on",
	})
	dead.AddCommand(a.outboxDeadListCmd(),
		a.outboxDeadActionCmd("requeue", "Make dead letters pending again: the relay retries them from the first attempt",
			(*outbox.Admin).RequeueTx),
		a.outboxDeadActionCmd("discard", "Drop dead letters for good; the later events of their keys flow again",
			(*outbox.Admin).DiscardTx))
	cmd.AddCommand(dead, a.outboxReplayCmd(), a.outboxCDCCmd())
	return cmd
}

func (a *app) outboxAdmin(ctx context.Context) (*outbox.Admin, error) {
	pool, err := a.connect(ctx)
	if err != nil {
		return nil, err
	}
	return outbox.NewAdmin(pool, outbox.AdminConfig{Schema: a.schema})
}

type outboxStats struct {
	Pending                 int64   `json:"pending"`
	PendingEstimated        bool    `json:"pending_estimated"`
	Dead                    int64   `json:"dead"`
	Blocked                 int64   `json:"blocked"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

// outboxDeadLetter is the JSON shape of an outbox dead letter: a contract
// for scripts, independent of the Go struct's field names.
type outboxDeadLetter struct {
	ID            int64             `json:"id"`
	EventID       string            `json:"event_id"`
	Topic         string            `json:"topic"`
	PartitionKey  string            `json:"partition_key"`
	AggregateType string            `json:"aggregate_type"`
	AggregateID   string            `json:"aggregate_id"`
	EventType     string            `json:"event_type"`
	Attempts      int               `json:"attempts"`
	LastError     string            `json:"last_error"`
	CreatedAt     time.Time         `json:"created_at"`
	DeadAt        time.Time         `json:"dead_at"`
	Payload       json.RawMessage   `json:"payload,omitempty"`        // a JSON payload as it is
	PayloadBase64 string            `json:"payload_base64,omitempty"` // a binary payload
	PayloadHidden bool              `json:"payload_hidden,omitempty"` // redacted whole (--redact, Config.Redact)
	Metadata      map[string]string `json:"metadata"`
}

func (a *app) outboxDeadListCmd() *cobra.Command {
	var p core.ListParams
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters in write order, a page at a time",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p.Limit < 1 || p.AfterID < 0 {
				return usagef("--limit must be positive and --after not negative")
			}
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			list, err := admin.List(cmd.Context(), p)
			if err != nil {
				return err
			}
			out := make([]outboxDeadLetter, 0, len(list))
			for _, d := range list {
				o := outboxDeadLetter{
					ID: d.ID, EventID: d.EventID, Topic: d.Topic, PartitionKey: d.PartitionKey,
					AggregateType: d.AggregateType, AggregateID: d.AggregateID, EventType: d.EventType,
					Attempts: d.Attempts, LastError: d.LastError, CreatedAt: d.CreatedAt, DeadAt: d.DeadAt,
					Metadata: d.Metadata,
				}
				var b64 []byte
				o.Payload, b64, o.PayloadHidden = a.payload(console.Resource{Kind: "outbox", Type: d.Topic, ID: d.EventID}, d.Payload,
					d.Binary || !json.Valid(d.Payload))
				if b64 != nil {
					o.PayloadBase64 = base64.StdEncoding.EncodeToString(b64)
				}
				out = append(out, o)
			}
			return a.emit(out, func(w io.Writer) {
				rows := make([][]string, 0, len(list))
				for _, d := range list {
					rows = append(rows, []string{d.EventID, strconv.FormatInt(d.ID, 10), d.Topic, d.PartitionKey, d.EventType,
						strconv.Itoa(d.Attempts), age(time.Since(d.DeadAt)), d.LastError})
				}
				table(w, []string{"EVENT ID", "ID", "TOPIC", "KEY", "TYPE", "ATTEMPTS", "DEAD FOR", "LAST ERROR"}, rows)
				if len(list) == p.Limit {
					fmt.Fprintf(w, "\nmore may follow: --after %d\n", list[len(list)-1].ID)
				}
			})
		},
	}
	f := cmd.Flags()
	f.IntVar(&p.Limit, "limit", 100, "most dead letters listed")
	f.Int64Var(&p.AfterID, "after", 0, "list dead letters with a row id above this one (the ID column of the previous page's last line)")
	f.StringVar(&p.Topic, "topic", "", "only this topic")
	f.StringVar(&p.PartitionKey, "key", "", "only this partition key")
	return cmd
}

// deadAction is the shape of Requeue and Discard in a caller's transaction.
type outboxAction func(a *outbox.Admin, ctx context.Context, tx pgx.Tx, by core.Actor, eventIDs ...string) (int, error)

type actionResult struct {
	Action   string   `json:"action"`
	Consumer string   `json:"consumer,omitempty"`
	Count    int      `json:"count"`
	EventIDs []string `json:"event_ids"`
}

func (a *app) outboxDeadActionCmd(name, short string, act outboxAction) *cobra.Command {
	var sel *deadSelection
	var w *who
	cmd := &cobra.Command{
		Use:   name + " [EVENT_ID...] --reason TEXT",
		Short: short,
		Long: short + ".\nAll or nothing: if any id is not a dead letter (unknown, or already requeued or discarded), " +
			"nothing changes and the command fails naming it.\nWithout ids, every dead letter the selection flags select " +
			"(--topic, --key, --error, --older-than; --dry-run first to count and list them), 500 per transaction.\n" +
			"Each dead letter acted on is recorded in the audit trail, in its transaction, with the operator\n" +
			"(--operator, default $USER) and the reason (--reason, asked for on a terminal).",
		Args: args(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, ids []string) error {
			if len(ids) == 0 {
				return a.outboxDeadBulk(cmd, name, sel, w)
			}
			if sel.set(cmd) {
				return usagef("the selection flags are for a bulk action: give event ids or the flags, not both")
			}
			ids, err := eventIDs(ids)
			if err != nil {
				return err
			}
			by, err := a.actor(w, name+" of "+strconv.Itoa(len(ids))+" outbox dead letter(s)")
			if err != nil {
				return err
			}
			for _, id := range ids {
				if err := a.authorize(cmd, by, console.Action(name), console.Resource{Kind: "outbox", ID: id}); err != nil {
					return err
				}
			}
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			n, err := a.allOrNothing(cmd.Context(), ids, func(tx pgx.Tx, id string) (bool, error) {
				n, err := act(admin, cmd.Context(), tx, by, id)
				return n == 1, err
			}, "an outbox dead letter")
			if err != nil {
				return err
			}
			return a.emitAction(actionResult{Action: name, Count: n, EventIDs: ids}, "outbox dead letter")
		},
	}
	sel = addDeadSelection(cmd) // bulk.go
	w = addWho(cmd)
	return cmd
}

// eventIDs checks that every id is a UUID, and drops repeats. A bad id is
// a usage error: nothing is sent to the database.
func eventIDs(ids []string) ([]string, error) {
	seen := make(map[uuid.UUID]bool, len(ids))
	out := make([]string, 0, len(ids))
	for _, s := range ids {
		id, err := uuid.Parse(s)
		if err != nil {
			return nil, usagef("event id %q is not a UUID", s)
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id.String())
		}
	}
	return out, nil
}

// allOrNothing applies act to each id in one transaction and commits only
// if every id was acted on; else it rolls back and names the first id that
// was not. It returns how many ids were acted on.
func (a *app) allOrNothing(ctx context.Context, ids []string, act func(tx pgx.Tx, id string) (bool, error), what string) (int, error) {
	tx, err := a.pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	for _, id := range ids {
		ok, err := act(tx, id)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("event %s is not %s (unknown id, or already requeued or discarded); nothing changed", id, what)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return len(ids), nil
}

func (a *app) emitAction(r actionResult, what string) error {
	return a.emit(r, func(w io.Writer) {
		verb := map[string]string{"requeue": "requeued", "discard": "discarded"}[r.Action]
		plural := "s"
		if r.Count == 1 {
			plural = ""
		}
		fmt.Fprintf(w, "%s %d %s%s\n", verb, r.Count, what, plural)
	})
}

func (a *app) outboxReplayCmd() *cobra.Command {
	var (
		f        outbox.ReplayFilter
		from, to string
		w        *who
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Publish again the published events a filter selects, with their original ids",
		Long: "Put published events back into the pending set; the relays publish them again, in order per key.\n" +
			"Filters combine with AND; at least one is required, or --all for every event retention kept.\n" +
			"Times are RFC 3339 (2026-11-30T10:00:00Z) or dates (2026-11-30, UTC): --from <= created_at < --to.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if f.From, err = parseTime("--from", from); err != nil {
				return err
			}
			if f.To, err = parseTime("--to", to); err != nil {
				return err
			}
			admin, err := a.outboxAdmin(cmd.Context())
			if err != nil {
				return err
			}
			// Without an Actor, Replay checks the filter and queues
			// nothing: a bad filter is refused before the reason is asked.
			if _, err := admin.Replay(cmd.Context(), f, core.Actor{}); errors.Is(err, outbox.ErrInvalidReplayFilter) {
				return usageError{err}
			}
			by, err := a.actor(w, "the replay")
			if err != nil {
				return err
			}
			if err := a.authorize(cmd, by, "requeue", console.Resource{Kind: "outbox", Type: f.Topic, Op: "replay"}); err != nil {
				return err
			}
			n, err := admin.Replay(cmd.Context(), f, by)
			if errors.Is(err, outbox.ErrInvalidReplayFilter) {
				return usageError{err}
			}
			if err != nil {
				return fmt.Errorf("%w (%d events queued before the failure; running it again is safe)", err, n)
			}
			return a.emit(map[string]int64{"queued": n}, func(w io.Writer) {
				fmt.Fprintf(w, "queued %d events for publishing again\n", n)
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&from, "from", "", "events created at or after this time")
	fl.StringVar(&to, "to", "", "events created before this time")
	fl.Int64Var(&f.FromID, "from-id", 0, "events with a row id at or above this one")
	fl.Int64Var(&f.ToID, "to-id", 0, "events with a row id at or below this one")
	fl.StringVar(&f.AggregateType, "aggregate-type", "", "only this aggregate type")
	fl.StringVar(&f.AggregateID, "aggregate-id", "", "only this aggregate id")
	fl.StringVar(&f.EventType, "event-type", "", "only this event type")
	fl.StringVar(&f.Topic, "topic", "", "only this topic")
	fl.StringVar(&f.PartitionKey, "key", "", "only this partition key")
	fl.BoolVar(&f.All, "all", false, "replay every published event retention kept (needed when no other filter is set)")
	w = addWho(cmd)
	return cmd
}

func parseTime(flag, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usagef("%s %q: want a time like 2026-11-30T10:00:00Z or a date like 2026-11-30", flag, s)
}
