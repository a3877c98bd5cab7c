package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/internal/poison"
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
			total, msgs, err := poison.Read(cmd.Context(), bs, argv[0], limit)
			if err != nil {
				return err
			}
			if msgs == nil {
				msgs = []poison.Message{}
			}
			out := struct {
				Topic    string           `json:"topic"`
				Total    int              `json:"total"`
				Messages []poison.Message `json:"messages"`
			}{argv[0], total, msgs}
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
		ids []string
		all bool
	)
	requeue := &cobra.Command{
		Use:   "requeue TOPIC",
		Short: "Publish poisoned messages back to the topic they came from, payload and metadata as they were",
		Long: "Publish poisoned messages (--id, repeatable, or --all) back to the topic each came from, with\n" +
			"their payload and original metadata (the poison keys removed), and say how many were sent. Kafka\n" +
			"keeps them on the poison topic: requeue a message once (an inbox consumer drops a repeat by its\n" +
			"event id). Fix the consumer first, or the message comes back.",
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if all == (len(ids) > 0) {
				return usagef("say which messages: --id UUID (repeatable) or --all")
			}
			bs, err := brokerList()
			if err != nil {
				return err
			}
			n, err := poison.Requeue(cmd.Context(), bs, argv[0], ids)
			if err != nil {
				return err
			}
			return a.emit(map[string]any{"topic": argv[0], "requeued": n}, func(w io.Writer) {
				fmt.Fprintf(w, "requeued %d message(s) from %s\n", n, argv[0])
			})
		},
	}
	requeue.Flags().StringSliceVar(&ids, "id", nil, "UUID of a message to requeue (repeatable)")
	requeue.Flags().BoolVar(&all, "all", false, "requeue every message of the topic")
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
