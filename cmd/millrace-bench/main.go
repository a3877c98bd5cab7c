// Command millrace-bench measures millrace on this machine, side by side in
// one run: the relay against watermill-sql's Forwarder and against raw
// batched produce, commit-to-ack latency against a 0.5 s poller, the cost of
// writing an event in the business transaction, the inbox, the outbox in
// change-data-capture mode, and consumers (batched against watermill-kafka's
// subscriber). It prints a table and writes the figures as JSON
// (bench/results.json from make bench).
// bench/README.md explains each figure.
//
//	millrace-bench -out bench/results.json            # full sizes
//	BENCH_QUICK=1 millrace-bench -out results.json     # smaller, under 3 minutes
//	millrace-bench -only relay,raw -n 50000            # some groups only
//
// PostgreSQL comes from DATABASE_URL; Kafka from KAFKA_BROKERS, else an
// embedded broker started in a child process (this binary, re-executed), so
// that the broker's CPU is not counted in the relay's process. The relay
// that drains the backlog runs in a child process too, so that its peak
// memory can be read. Every measurement gets a fresh schema and fresh
// topics, dropped afterwards (topics live as long as the embedded broker).
//
// A missed target is reported, not an error: the exit status is non-zero
// only when something failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// groups are the figure groups, in the order they run.
var groups = []string{"relay", "forwarder", "raw", "latency", "write", "dedup", "inbox", "saga", "cdc", "consumer"}

// extraGroups run only when -only names them: scale takes minutes;
// saga-latency is the saga group's latency phases alone, for comparing
// builds side by side.
var extraGroups = []string{"scale", "saga-latency"}

// childEnv marks a process started by the bench itself (the broker or the
// relay). The test binary checks it in TestMain to run main instead of the
// tests.
const childEnv = "MILLRACE_BENCH_CHILD"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "millrace-bench:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	out      string
	only     []string
	n        int
	quick    bool
	duration time.Duration

	cpuprofile   string
	sagaProfile  string
	latProfile   string
	sagaRate     int
	relayWorkers int
	relayBatch   int

	// Hidden: the roles of child processes.
	serveBroker bool
	echo        bool
	runRelay    bool
	schema      string
	brokers     string
}

// defaultOut is where a full run writes its figures.
const defaultOut = "bench/results.json"

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("millrace-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var only string
	fs.StringVar(&o.out, "out", "", "write the figures as JSON to this file (default "+defaultOut+", but no file with -only: a part of the figures does not replace the committed whole)")
	fs.StringVar(&only, "only", "", "comma-separated figure groups to run: "+strings.Join(groups, ",")+" (default: all of them), or "+strings.Join(extraGroups, ",")+" (only when named)")
	fs.IntVar(&o.n, "n", 0, "backlog size for relay, forwarder, raw and cdc; consumer reads n/4 (default 200000; 20000 with BENCH_QUICK=1)")
	fs.DurationVar(&o.duration, "duration", 0, "length of each timed phase of latency, write, dedup, inbox and cdc (default 10s; 3s with BENCH_QUICK=1)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the relay child while it drains the backlog")
	fs.StringVar(&o.sagaProfile, "saga-cpuprofile", "", "write a CPU profile of this process during the saga throughput phase")
	fs.StringVar(&o.latProfile, "saga-latency-cpuprofile", "", "write a CPU profile of this process during the first saga latency phase")
	fs.IntVar(&o.sagaRate, "saga-rate", 200, "sagas started per second in the saga latency phases (the target is at 200); one phase runs first at a quarter of it")
	fs.IntVar(&o.relayWorkers, "relay-workers", 0, "RelayConfig.Workers for the draining relay (0: the relay's default)")
	fs.IntVar(&o.relayBatch, "relay-batch", 0, "RelayConfig.BatchSize for the draining relay (0: the relay's default)")
	hidden := map[string]bool{"echo": true, "serve-broker": true, "run-relay": true, "schema": true, "brokers": true}
	fs.BoolVar(&o.echo, "echo", false, "child role: write back each byte read from stdin")
	fs.BoolVar(&o.serveBroker, "serve-broker", false, "child role: run the embedded broker, print its address, stop at EOF on stdin")
	fs.BoolVar(&o.runRelay, "run-relay", false, "child role: drain the backlog in -schema to -brokers and report on stdout")
	fs.StringVar(&o.schema, "schema", "", "child: schema holding the backlog")
	fs.StringVar(&o.brokers, "brokers", "", "child: comma-separated broker addresses")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: millrace-bench [flags]\n\nEnvironment: DATABASE_URL, KAFKA_BROKERS, BENCH_QUICK=1.\n\nFlags:\n")
		fs.VisitAll(func(f *flag.Flag) {
			if !hidden[f.Name] {
				fmt.Fprintf(fs.Output(), "  -%s\t%s\n", f.Name, f.Usage)
			}
		})
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.quick = os.Getenv("BENCH_QUICK") != "" && os.Getenv("BENCH_QUICK") != "0"
	if o.n == 0 {
		o.n = 200_000
		if o.quick {
			o.n = 20_000
		}
	}
	if o.duration == 0 {
		o.duration = 10 * time.Second
		if o.quick {
			o.duration = 3 * time.Second
		}
	}
	if o.n < 1 || o.duration <= 0 || o.sagaRate < 4 {
		return nil, errors.New("-n and -duration must be positive, -saga-rate at least 4")
	}
	if o.out == "" && only == "" {
		o.out = defaultOut
	}
	o.only = groups
	if only != "" {
		o.only = nil
		for _, g := range strings.Split(only, ",") {
			g = strings.TrimSpace(g)
			if !slices.Contains(groups, g) && !slices.Contains(extraGroups, g) {
				return nil, fmt.Errorf("-only: unknown group %q (known: %s)", g, strings.Join(append(groups, extraGroups...), ","))
			}
			o.only = append(o.only, g)
		}
	}
	return o, nil
}

// run is the whole program; main_test.go calls it too.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case o.echo:
		return serveEcho(os.Stdin, os.Stdout)
	case o.serveBroker:
		return serveBroker(ctx, os.Stdin, stdout)
	case o.runRelay:
		return runRelayChild(ctx, o, stdout)
	}
	b, err := newBench(ctx, o, stderr)
	if err != nil {
		return err
	}
	defer b.close()
	started := time.Now()
	for _, g := range append(groups, extraGroups...) {
		if !slices.Contains(o.only, g) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		b.progress("== %s", g)
		if err := b.runGroup(ctx, g); err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
	}
	b.ratios()
	b.config["load_avg_end"] = loadAverage()
	// Only the load before the run says something about other processes:
	// by the end the bench's own work (PostgreSQL, the broker, the relay
	// child) is in the average.
	if l := b.config["load_avg_start"].(float64); l > float64(runtime.NumCPU()) {
		b.note("the machine was busy before the run (1-minute load average %.1f on %d CPUs): other processes share the CPUs, the figures are lower and noisier", l, runtime.NumCPU())
	}
	b.config["wall_s"] = round(time.Since(started).Seconds(), 1)
	printTable(stdout, b)
	if o.out == "" {
		fmt.Fprintf(stdout, "\nno file written: -only without -out (wall time %s)\n", time.Since(started).Round(time.Second))
		return nil
	}
	if err := b.writeJSON(o.out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nwrote %s (wall time %s)\n", o.out, time.Since(started).Round(time.Second))
	return nil
}

func (b *bench) runGroup(ctx context.Context, g string) error {
	switch g {
	case "relay":
		return b.benchRelay(ctx)
	case "forwarder":
		return b.benchForwarder(ctx)
	case "raw":
		return b.benchRaw(ctx)
	case "latency":
		return b.benchLatency(ctx)
	case "write":
		return b.benchWrite(ctx)
	case "dedup":
		return b.benchDedup(ctx)
	case "saga":
		return b.benchSagas(ctx)
	case "inbox":
		return b.benchInbox(ctx)
	case "cdc":
		return b.benchCDC(ctx)
	case "consumer":
		return b.benchConsumer(ctx)
	case "scale":
		return b.benchScale(ctx)
	case "saga-latency":
		return b.benchSagaLatency(ctx)
	}
	return fmt.Errorf("unknown group %q", g)
}
