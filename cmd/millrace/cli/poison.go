package cli

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/poisontopic"
)

func (a *app) poisonCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "poison",
		Short: "Poison topics on Kafka: the messages a handler refused for good, with the reason",
		Long: "A poison topic holds the messages a PoisonQueue refused for good (a participant's command\n" +
			"it does not know or cannot decode, a reply that is not a saga reply), each with the reason in\n" +
			"its metadata (reason_poisoned) and the topic it came from (topic_poisoned). These commands read\n" +
			"them from Kafka (--brokers, default $KAFKA_BROKERS) and send them back to where they came from.",
	})
	brokerList := a.brokersFlag(cmd)

	var limit int
	list := &cobra.Command{
		Use:   "list TOPIC",
		Short: "Count a poison topic's messages and list them, newest first, with the reason",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if limit < 1 {
				return usagef("--limit must be positive")
			}
			bs, err := brokerList()
			if err != nil {
				return err
			}
			total, msgs, err := poisontopic.Read(cmd.Context(), bs, argv[0], limit)
			if err != nil {
				return err
			}
			shown := make([]poisonMessage, len(msgs))
			for i, m := range msgs {
				shown[i].Message = m
				if p := a.show(console.Resource{Kind: "poison", Type: argv[0], ID: m.UUID}, []byte(m.Payload)); p == nil && m.Payload != "" {
					shown[i].Payload, shown[i].PayloadHidden = "", true
				} else {
					shown[i].Payload = string(p)
				}
			}
			out := struct {
				Topic    string          `json:"topic"`
				Total    int             `json:"total"`
				Messages []poisonMessage `json:"messages"`
			}{argv[0], total, shown}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "%d poisoned message(s) on %s", total, argv[0])
				if len(msgs) < total {
					fmt.Fprintf(w, ", the newest %d shown", len(msgs))
				}
				fmt.Fprintln(w)
				if len(msgs) == 0 {
					return
				}
				rows := make([][]string, len(msgs))
				for i, m := range msgs {
					rows[i] = []string{m.Time.UTC().Format("2006-01-02 15:04:05"), m.UUID, m.Topic,
						strconv.Itoa(int(m.Partition)) + "/" + strconv.FormatInt(m.Offset, 10), m.Reason}
				}
				// The reason is the point: print it whole, after the table.
				table(w, []string{"POISONED", "UUID", "FROM TOPIC", "PARTITION/OFFSET", "REASON"}, rows)
				for _, m := range msgs {
					fmt.Fprintf(w, "\n%s: %s\n", m.UUID, m.Reason)
				}
			})
		},
	}
	list.Flags().IntVar(&limit, "limit", 50, "most messages to list")

	var (
		ids  []string
		all  bool
		sel  poisonSelection
		w    *who
		flag = []string{"reason-match", "from-topic", "older-than", "dry-run"}
	)
	requeue := &cobra.Command{
		Use:   "requeue TOPIC",
		Short: "Publish poisoned messages back to the topic they came from, payload and metadata as they were",
		Long: "Publish poisoned messages (--id, repeatable, or --all) back to the topic each came from, with\n" +
			"their payload and original metadata (the poison keys removed), and say how many were sent. Kafka\n" +
			"keeps them on the poison topic: requeue a message once (an inbox consumer drops a repeat by its\n" +
			"event id). Fix the consumer first, or the message comes back.\n" +
			"In bulk, every message the selection flags select (--reason-match, --from-topic, --older-than;\n" +
			"--dry-run first to count and list them, newest first); a message that does not say its original\n" +
			"topic is refused and counted. There is no discard: Kafka cannot delete one message from a topic;\n" +
			"the poison topic's retention (retention.ms) removes them all in time.\n" +
			"Each requeue is recorded in the audit trail of --schema (after it is sent: Kafka is not in the\n" +
			"transaction), with the operator (--operator, default $USER) and the reason (--reason).",
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			bulk := false
			for _, name := range flag {
				bulk = bulk || cmd.Flags().Changed(name)
			}
			if bulk && len(ids) > 0 {
				return usagef("the selection flags are for a bulk action: give --id or the flags, not both")
			}
			if bulk && all {
				return usagef("--all requeues every message: give --all or the selection flags, not both")
			}
			if bulk {
				return a.poisonBulk(cmd, argv[0], &sel, w, brokerList)
			}
			if all == (len(ids) > 0) {
				return usagef("say which messages: --id UUID (repeatable), --all, or select them with --reason-match, --from-topic or --older-than")
			}
			bs, err := brokerList()
			if err != nil {
				return err
			}
			by, err := a.poisonActor(cmd, argv[0], w)
			if err != nil {
				return err
			}
			n, err := poisontopic.Requeue(cmd.Context(), bs, argv[0], ids)
			if aerr := a.auditPoison(cmd, by, argv[0], map[string]any{"ids": ids, "all": all, "requeued": n}, n, err); aerr != nil {
				return errors.Join(err, aerr)
			}
			if err != nil {
				return err
			}
			return a.emit(map[string]any{"topic": argv[0], "requeued": n}, func(w io.Writer) {
				fmt.Fprintf(w, "requeued %d message(s) from %s\n", n, argv[0])
			})
		},
	}
	f := requeue.Flags()
	f.StringSliceVar(&ids, "id", nil, "UUID of a message to requeue (repeatable)")
	f.BoolVar(&all, "all", false, "requeue every message of the topic")
	f.StringVar(&sel.reason, "reason-match", "", "bulk: messages whose reason matches this SQL LIKE pattern (e.g. '%unknown command%')")
	f.StringVar(&sel.from, "from-topic", "", "bulk: messages poisoned from this topic")
	f.DurationVar(&sel.older, "older-than", 0, "bulk: messages poisoned longer ago than this (e.g. 1h)")
	f.BoolVar(&sel.dryRun, "dry-run", false, "bulk: count and list what would be requeued; send nothing")
	w = addWho(requeue)
	cmd.AddCommand(list, requeue)
	return cmd
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// poisonSelection are the selection flags of a bulk requeue of a poison
// topic.
type poisonSelection struct {
	reason, from string
	older        time.Duration
	dryRun       bool
}

// poisonBulk requeues the messages of a poison topic the flags select
// (poisontopic.RequeueMatching), or with --dry-run counts and lists them; the
// output is a bulk dead-letter action's.
func (a *app) poisonBulk(cmd *cobra.Command, topic string, s *poisonSelection, w *who, brokerList func() ([]string, error)) error {
	if s.older < 0 {
		return usagef("--older-than must not be negative")
	}
	q := poisontopic.Query{Reason: s.reason, FromTopic: s.from}
	if s.older > 0 {
		q.PoisonedBefore = time.Now().Add(-s.older)
	}
	if !q.Selected() {
		return usagef("select messages with --reason-match, --from-topic or --older-than (or requeue them with --id or --all)")
	}
	bs, err := brokerList()
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	out := deadBulkJSON{Action: "requeue", DryRun: s.dryRun, Topic: topic, EventIDs: []string{}}
	if s.dryRun {
		d, err := poisontopic.DryRunMatching(ctx, bs, topic, q, 20)
		if err != nil {
			return err
		}
		out.Count = d.Count
		for _, m := range d.First {
			out.EventIDs = append(out.EventIDs, m.UUID)
		}
	} else {
		by, err := a.poisonActor(cmd, topic, w)
		if err != nil {
			return err
		}
		done, err := poisontopic.RequeueMatching(ctx, bs, topic, q)
		detail := map[string]any{"reason_match": s.reason, "from_topic": s.from, "older_than": s.older.String(),
			"matched": done.Matched, "requeued": done.Requeued, "refused": done.Refused}
		if aerr := a.auditPoison(cmd, by, topic, detail, done.Requeued, err); aerr != nil {
			return errors.Join(err, aerr)
		}
		if err != nil && done.Matched > 0 {
			return fmt.Errorf("%w (%d of the %d matching were requeued before it)", err, done.Requeued, done.Matched)
		}
		if err != nil {
			return err
		}
		out.Count, out.Refused = done.Requeued, done.Refused
		if len(out.Refused) == 0 {
			out.Refused = nil
		}
	}
	return a.emit(out, func(w io.Writer) {
		if s.dryRun {
			fmt.Fprintf(w, "dry run: requeue would apply to %d poisoned messages on %s; nothing was sent. The newest: %s\n",
				out.Count, topic, strings.Join(out.EventIDs, " "))
			return
		}
		fmt.Fprintf(w, "requeued %d poisoned messages from %s\n", out.Count, topic)
		reasons := make([]string, 0, len(out.Refused))
		for r := range out.Refused {
			reasons = append(reasons, r)
		}
		sort.Strings(reasons)
		for _, r := range reasons {
			fmt.Fprintf(w, "refused %d: %s\n", out.Refused[r], r)
		}
	})
}

// poisonMessage is a poisoned message as --json prints it, its payload
// as show lets it through.
type poisonMessage struct {
	poisontopic.Message
	PayloadHidden bool `json:"payload_hidden,omitempty"`
}

// poisonActor is who requeues from topic, authorized, with the schema's
// audit trail reachable: checked before anything is sent.
func (a *app) poisonActor(cmd *cobra.Command, topic string, w *who) (core.Actor, error) {
	by, err := a.actor(w, "the requeue")
	if err != nil {
		return by, err
	}
	if err := a.authorize(cmd, by, "requeue", console.Resource{Kind: "poison", Type: topic}); err != nil {
		return by, err
	}
	pool, err := a.connect(cmd.Context())
	if err != nil {
		return by, err
	}
	return by, audit.New(a.schema).Probe(cmd.Context(), pool)
}

// auditPoison records a requeue from a poison topic in the audit trail,
// after it was sent (also when it failed after sending some).
func (a *app) auditPoison(cmd *cobra.Command, by core.Actor, topic string, detail map[string]any, sent int, err error) error {
	if err != nil && sent == 0 {
		return nil
	}
	if err != nil {
		detail["error"] = err.Error()
	}
	e := audit.Entry{Actor: by, Action: "poison.requeue", Kind: audit.KindPoison, Scope: topic, Detail: detail}
	if err := audit.New(a.schema).Write(cmd.Context(), a.pool, e); err != nil {
		return fmt.Errorf("requeued %d, but the audit trail did not record it: %w", sent, err)
	}
	return nil
}
