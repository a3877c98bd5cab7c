package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/internal/conform"
)

// conformCmd is "millrace conform": the conformance kit of the saga wire
// protocol (docs/protocol.md), and the Go participant it is run against.
func (a *app) conformCmd() *cobra.Command {
	cmd := group(&cobra.Command{
		Use:   "conform",
		Short: "The conformance kit of the saga wire protocol, for participants in any language",
	})
	var (
		brokers                        string
		topic, replyTopic, poisonTopic string
		effects, run                   string
		cases                          []string
		timeout                        time.Duration
	)
	brokerList := func() []string {
		b := brokers
		if b == "" {
			b = a.getenv("KAFKA_BROKERS")
		}
		return splitList(b)
	}
	participant := &cobra.Command{
		Use:   "participant",
		Short: "Drive a participant over Kafka through the protocol's test vectors; print a pass/fail table",
		Long: "participant plays a saga orchestrator against the participant that --run starts (a shell command that\n" +
			"runs it in the foreground, with DATABASE_URL, KAFKA_BROKERS, MILLRACE_SCHEMA, MILLRACE_TOPIC and\n" +
			"MILLRACE_CONFORM_CRASH_FILE in its environment). It migrates --schema, creates its conform_effect\n" +
			"table, ships the schema's outbox with a relay of its own, sends the cases of testdata/protocol\n" +
			"(duplicates, reordering, empty and late compensations, repeated compensations, unknown protocol\n" +
			"versions, poison) to --topic, checks the replies, the effects (--effects, a query returning saga id,\n" +
			"step, operation and amount) and the poison topic, crashes the participant between an effect and its\n" +
			"commit and starts it again. It prints one line per case and exits 1 if any failed.\n" +
			"Without --brokers or KAFKA_BROKERS it starts an embedded broker. docs/protocol.md says what the\n" +
			"participant must register (the conform.reserve command).",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("schema") {
				return usagef("--schema is required: the kit migrates it and writes test rows there (use a schema of its own)")
			}
			if topic == "" || run == "" {
				return usagef("--topic and --run are required")
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			bs := brokerList()
			where := strings.Join(bs, ",")
			if len(bs) == 0 {
				b, err := devbroker.Start(devbroker.Config{})
				if err != nil {
					return err
				}
				defer b.Close()
				bs, where = b.Addrs(), "the embedded broker at "+strings.Join(b.Addrs(), ",")
			}
			url := a.databaseURL
			if url == "" {
				url = a.getenv("DATABASE_URL")
			}
			fmt.Fprintf(a.stdout, "conformance of %q on %s, topic %s, schema %s\n", run, where, topic, a.schema)
			start := time.Now()
			results, err := conform.RunKit(cmd.Context(), conform.KitConfig{
				Brokers: bs, Topic: topic, ReplyTopic: replyTopic, PoisonTopic: poisonTopic,
				Pool: pool, DatabaseURL: url, Schema: a.schema, Effects: effects, Run: run,
				Cases: cases, Timeout: timeout, Log: a.stderr,
			})
			if err != nil {
				return err
			}
			failed := conform.PrintResults(a.stdout, results)
			fmt.Fprintf(a.stdout, "took %s\n", time.Since(start).Round(100*time.Millisecond))
			if failed > 0 {
				return fmt.Errorf("conform: %d of %d cases failed", failed, len(results))
			}
			return nil
		},
	}
	f := participant.Flags()
	f.StringVar(&brokers, "brokers", "", "Kafka broker addresses, comma-separated (default $KAFKA_BROKERS; neither: an embedded broker)")
	f.StringVar(&topic, "topic", "", "the participant's command topic (required)")
	f.StringVar(&replyTopic, "reply-topic", "", "the topic the commands ask replies on (default TOPIC.replies)")
	f.StringVar(&poisonTopic, "poison-topic", "", "the topic the participant poisons records to (default TOPIC.poison)")
	f.StringVar(&effects, "effects", "", "SQL returning the participant's effects: saga_id, step, operation, amount (default: SCHEMA.conform_effect)")
	f.StringVar(&run, "run", "", "shell command that runs the participant in the foreground (required)")
	f.StringArrayVar(&cases, "case", nil, "run only this case (repeatable; default all)")
	f.DurationVar(&timeout, "timeout", 2*time.Minute, "the longest wait for the participant: to start, to answer, to crash")

	var name string
	goParticipant := &cobra.Command{
		Use:   "go-participant",
		Short: "Run the Go participant of the conformance kit (a millrace.Service) until interrupted",
		Long: "go-participant runs millrace's Go participant with the conformance command registered, as a service\n" +
			"wired with millrace.New's defaults, for \"millrace conform participant --run\". --topic and --schema\n" +
			"default to $MILLRACE_TOPIC and $MILLRACE_SCHEMA, which the kit sets.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("schema") && a.getenv("MILLRACE_SCHEMA") != "" {
				a.schema = a.getenv("MILLRACE_SCHEMA")
			}
			if topic == "" {
				topic = a.getenv("MILLRACE_TOPIC")
			}
			bs := brokerList()
			if topic == "" || len(bs) == 0 {
				return usagef("--topic (or MILLRACE_TOPIC) and --brokers (or KAFKA_BROKERS) are required")
			}
			pool, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			return conform.RunGoParticipant(cmd.Context(), conform.GoParticipantConfig{
				Pool: pool, Schema: a.schema, Brokers: bs, Topic: topic, Name: name})
		},
	}
	g := goParticipant.Flags()
	g.StringVar(&brokers, "brokers", "", "Kafka broker addresses, comma-separated (default $KAFKA_BROKERS)")
	g.StringVar(&topic, "topic", "", "the command topic (default $MILLRACE_TOPIC)")
	g.StringVar(&name, "name", "", "the service's name: consumer group and inbox consumer (default conform-TOPIC)")
	cmd.AddCommand(participant, goParticipant)
	return cmd
}
