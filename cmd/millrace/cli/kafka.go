package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/millrace/millrace/internal/kafkalag"
	"github.com/spf13/cobra"
)

// brokersFlag adds --brokers to cmd (and its subcommands) and returns the
// list it names, or $KAFKA_BROKERS.
func (a *app) brokersFlag(cmd *cobra.Command) func() ([]string, error) {
	var brokers string
	cmd.PersistentFlags().StringVar(&brokers, "brokers", "", "Kafka broker addresses, comma-separated (default $KAFKA_BROKERS)")
	return func() ([]string, error) {
		b := brokers
		if b == "" {
			b = a.getenv("KAFKA_BROKERS")
		}
		out := splitList(b)
		if len(out) == 0 {
			return nil, usagef("no Kafka: set KAFKA_BROKERS or --brokers")
		}
		return out, nil
	}
}

func (a *app) kafkaCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "kafka",
		Short: "Kafka as millrace's consumers see it: consumer groups' lag",
	})
	brokerList := a.brokersFlag(cmd)
	var (
		groups     []string
		stallAfter time.Duration
		all        bool
	)
	lag := &cobra.Command{
		Use:   "lag",
		Short: "Each consumer group's lag per partition, who holds it, and the age of its oldest unconsumed record",
		Long: "lag reads every consumer group (or those named with --group) and prints, per topic and partition,\n" +
			"the committed offset, the end offset, the lag, the member that holds the partition, and how long\n" +
			"ago the oldest unconsumed record was written. A partition whose oldest unconsumed record is older\n" +
			"than --stall-after is STALLED: records wait and nobody takes them (no member holds the partition,\n" +
			"or the one that does is dead or stuck); the sagas whose commands wait there will time out.\n" +
			"Partitions without lag are left out unless --all is given.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			bs, err := brokerList()
			if err != nil {
				return err
			}
			if stallAfter <= 0 {
				return usagef("--stall-after must be positive")
			}
			r, err := kafkalag.New(kafkalag.Config{Brokers: bs, Groups: groups, StallAfter: stallAfter})
			if err != nil {
				return err
			}
			defer r.Close()
			lags, err := r.Read(cmd.Context())
			if err != nil {
				return err
			}
			shown := []kafkalag.Partition{}
			stalled, lagging := 0, 0
			for _, l := range lags {
				if l.Stalled {
					stalled++
				}
				if l.Lag != 0 || l.Err != "" {
					lagging++
				}
				if all || l.Lag != 0 || l.Err != "" {
					shown = append(shown, l)
				}
			}
			out := struct {
				Partitions int                  `json:"partitions"`
				Stalled    int                  `json:"stalled"`
				Lags       []kafkalag.Partition `json:"lags"`
			}{len(lags), stalled, shown}
			return a.emit(out, func(w io.Writer) {
				shownWhat := "the lagging ones shown"
				if all {
					shownWhat = "all shown"
				}
				fmt.Fprintf(w, "%d partition(s) of %d group(s) read, %d lagging, %d stalled; %s\n", len(lags), countGroups(lags), lagging, stalled, shownWhat)
				if len(shown) == 0 {
					return
				}
				rows := make([][]string, len(shown))
				for i, l := range shown {
					state := ""
					switch {
					case l.Err != "":
						state = "ERROR: " + l.Err
					case l.Stalled:
						state = "STALLED"
					}
					member := l.Member
					if member == "" {
						member = "(none)"
					}
					committed := strconv.FormatInt(l.Committed, 10)
					if l.Committed < 0 {
						committed = "-"
					}
					age := ""
					if l.OldestAge > 0 {
						age = l.OldestAge.Round(time.Second).String()
					}
					rows[i] = []string{l.Group, l.Topic, strconv.Itoa(int(l.Partition)), committed,
						strconv.FormatInt(l.End, 10), strconv.FormatInt(l.Lag, 10), member, age, state}
				}
				table(w, []string{"GROUP", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "MEMBER", "OLDEST", "STATE"}, rows)
			})
		},
	}
	lag.Flags().StringSliceVar(&groups, "group", nil, "consumer group to read (repeat for several; default every group)")
	lag.Flags().DurationVar(&stallAfter, "stall-after", time.Minute, "age of the oldest unconsumed record past which a partition is reported stalled")
	lag.Flags().BoolVar(&all, "all", false, "list the partitions without lag too")
	cmd.AddCommand(lag)
	return cmd
}

func countGroups(lags []kafkalag.Partition) int {
	seen := map[string]bool{}
	for _, l := range lags {
		seen[l.Group] = true
	}
	return len(seen)
}
