package conform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
)

// KitConfig configures a run of the conformance kit.
type KitConfig struct {
	// Brokers are the Kafka brokers. Required.
	Brokers []string
	// Topic is the participant's command topic. Required.
	Topic string
	// ReplyTopic is where the commands ask for replies. Defaults to Topic
	// + ".replies".
	ReplyTopic string
	// PoisonTopic is where the participant poisons records. Defaults to
	// Topic + ".poison".
	PoisonTopic string
	// Pool connects to the participant's database; DatabaseURL is its URL,
	// for the participant's environment. Required.
	Pool        *pgxpool.Pool
	DatabaseURL string
	// Schema holds the participant's millrace tables and conform_effect;
	// the kit migrates it and creates the table. Required.
	Schema string
	// Effects is the query of the participant's effects, returning saga
	// id, step, operation and amount. Defaults to EffectsQuery(Schema).
	Effects string
	// Run is the shell command that runs the participant in the
	// foreground; the kit starts it, and starts it again after its crash.
	// Required.
	Run string
	// Cases names the cases to run. Defaults to all.
	Cases []string
	// Timeout bounds each wait: for the participant to start, for the
	// replies, for the crash. Defaults to 2 minutes.
	Timeout time.Duration
	// Log receives the kit's progress. Defaults to io.Discard.
	Log io.Writer
}

// Result is the outcome of one case.
type Result struct {
	Case     string
	Problems []string
	Took     time.Duration
}

// Passed reports whether the case passed.
func (r Result) Passed() bool { return len(r.Problems) == 0 }

// kit is one run.
type kit struct {
	cfg    KitConfig
	runID  string
	client *kgo.Client
	p      *process
	log    func(format string, args ...any)

	mu       sync.Mutex
	replies  map[string][]ObservedReply // by saga id
	poisoned map[string]map[int]bool    // by saga id
	changed  chan struct{}              // closed and renewed when a record arrives
}

// RunKit runs the cases against the participant cfg.Run starts, and
// returns a result per case. An error means the kit could not run (a
// database, a broker or a participant that never answered), not that a
// case failed.
func RunKit(ctx context.Context, cfg KitConfig) (results []Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cases, err := cfg.cases()
	if err != nil {
		return nil, err
	}
	k := &kit{cfg: cfg, runID: "conform-" + uuid.NewString()[:8], replies: map[string][]ObservedReply{},
		poisoned: map[string]map[int]bool{}, changed: make(chan struct{})}
	k.log = func(format string, args ...any) {
		fmt.Fprintf(cfg.Log, "conform: "+format+"\n", args...)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if err := k.prepareDatabase(ctx); err != nil {
		return nil, err
	}
	if k.client, err = kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ConsumeTopics(cfg.ReplyTopic, cfg.PoisonTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ProducerLinger(0)); err != nil {
		return nil, err
	}
	defer k.client.Close()
	if err := k.createTopics(ctx); err != nil {
		return nil, err
	}
	stopRelay, err := k.startRelay(ctx)
	if err != nil {
		return nil, err
	}
	defer stopRelay()
	consumeCtx, stopConsume := context.WithCancel(ctx)
	consumed := make(chan struct{})
	go func() { defer close(consumed); k.consume(consumeCtx) }()
	defer func() { stopConsume(); <-consumed }()

	dir, err := os.MkdirTemp("", "millrace-conform-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	k.p = &process{run: cfg.Run, log: filepath.Join(dir, "participant.log"), crashFile: filepath.Join(dir, "crash"),
		env: []string{"DATABASE_URL=" + cfg.DatabaseURL, "KAFKA_BROKERS=" + strings.Join(cfg.Brokers, ","),
			"MILLRACE_SCHEMA=" + cfg.Schema, "MILLRACE_TOPIC=" + cfg.Topic}}
	if err := k.p.start(); err != nil {
		return nil, err
	}
	defer k.p.stop()
	k.log("participant started: %s (log: %s)", cfg.Run, k.p.log)
	defer func() {
		if err != nil || slices.ContainsFunc(results, func(r Result) bool { return !r.Passed() }) {
			k.p.dumpLog(cfg.Log)
		}
	}()

	// The participant answers a probe: it runs, reads its topic, replies.
	ready := k.runID + "-ready"
	start := time.Now()
	if err := k.produce(ctx, Probe(ready, cfg.ReplyTopic)); err != nil {
		return nil, err
	}
	if err := k.waitProbes(ctx, []string{ready}); err != nil {
		return nil, fmt.Errorf("conform: the participant did not answer a first command: %w", err)
	}
	k.log("participant answered in %s", time.Since(start).Round(time.Millisecond))

	// The cases that do not crash it, all at once: one saga each; then the
	// crash cases, one at a time.
	var calm, crashing []Case
	for _, c := range cases {
		if c.Crashes() {
			crashing = append(crashing, c)
		} else {
			calm = append(calm, c)
		}
	}
	if results, err = k.calmCases(ctx, calm); err != nil {
		return nil, err
	}
	for _, c := range crashing {
		results = append(results, k.crashCase(ctx, c))
	}
	return results, nil
}

// withDefaults checks cfg and fills in its defaults.
func (cfg KitConfig) withDefaults() (KitConfig, error) {
	switch {
	case len(cfg.Brokers) == 0, cfg.Topic == "", cfg.Pool == nil, cfg.Schema == "", cfg.Run == "":
		return cfg, fmt.Errorf("%w: conform: Brokers, Topic, Pool, Schema and Run are required", core.ErrConfig)
	}
	if cfg.ReplyTopic == "" {
		cfg.ReplyTopic = cfg.Topic + ".replies"
	}
	if cfg.PoisonTopic == "" {
		cfg.PoisonTopic = cfg.Topic + ".poison"
	}
	if cfg.Effects == "" {
		cfg.Effects = EffectsQuery(cfg.Schema)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	return cfg, nil
}

// cases returns the cases cfg names, or every case.
func (cfg KitConfig) cases() ([]Case, error) {
	cases, err := Cases()
	if err != nil {
		return nil, err
	}
	if len(cfg.Cases) > 0 {
		cases = slices.DeleteFunc(cases, func(c Case) bool { return !slices.Contains(cfg.Cases, c.Name) })
		if len(cases) != len(cfg.Cases) {
			return nil, fmt.Errorf("%w: conform: unknown case among %v", core.ErrConfig, cfg.Cases)
		}
	}
	return cases, nil
}

// calmCases runs the cases that do not crash the participant, all at
// once, one saga each, and checks each.
func (k *kit) calmCases(ctx context.Context, calm []Case) ([]Result, error) {
	start := time.Now()
	var sagas []string
	for _, c := range calm {
		id := k.sagaID(c)
		sagas = append(sagas, id)
		if err := k.produce(ctx, append(c.Records(id, k.cfg.ReplyTopic), Probe(id, k.cfg.ReplyTopic))...); err != nil {
			return nil, err
		}
	}
	probeErr := k.waitProbes(ctx, sagas)
	k.waitPoisoned(ctx, calm)
	effects, err := k.effects(ctx)
	if err != nil {
		return nil, err
	}
	took := time.Since(start)
	var results []Result
	for _, c := range calm {
		r := Result{Case: c.Name, Took: took}
		if probeErr != nil && !k.probed(k.sagaID(c)) {
			r.Problems = append(r.Problems, "its records were not all handled: "+probeErr.Error())
		}
		r.Problems = append(r.Problems, c.Check(k.sagaID(c), k.observed(k.sagaID(c), effects))...)
		results = append(results, r)
	}
	return results, nil
}

func (k *kit) sagaID(c Case) string { return k.runID + "-" + c.Name }

// prepareDatabase migrates the schema and creates the effects table.
func (k *kit) prepareDatabase(ctx context.Context) error {
	m, err := migrations.New(k.cfg.Pool, migrations.Config{Schema: k.cfg.Schema})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("conform: migrate schema %s: %w", k.cfg.Schema, err)
	}
	if _, err := k.cfg.Pool.Exec(ctx, EffectsTableSQL(k.cfg.Schema)); err != nil {
		return fmt.Errorf("conform: create the effects table: %w", err)
	}
	return nil
}

// createTopics creates the command, reply and poison topics, if new.
func (k *kit) createTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	resp, err := kadm.NewClient(k.client).CreateTopics(ctx, 4, -1, nil, k.cfg.Topic, k.cfg.ReplyTopic, k.cfg.PoisonTopic)
	if err != nil {
		return fmt.Errorf("conform: create topics: %w", err)
	}
	for _, t := range resp.Sorted() {
		if t.Err != nil && !errors.Is(t.Err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("conform: create topic %s: %w", t.Topic, t.Err)
		}
	}
	return nil
}

// startRelay ships the schema's outbox (the participant's replies and
// poisoned records) to the brokers.
func (k *kit) startRelay(ctx context.Context) (stop func(), err error) {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: k.cfg.Brokers}, logging.Default())
	if err != nil {
		return nil, err
	}
	relay, err := outbox.NewRelay(k.cfg.Pool, outbox.RelayConfig{Schema: k.cfg.Schema, Publisher: pub})
	if err != nil {
		_ = pub.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := relay.Run(ctx); err != nil && ctx.Err() == nil {
			k.log("relay: %v", err)
		}
	}()
	return func() { cancel(); <-done; _ = pub.Close() }, nil
}

// produce sends records in order and waits for them to be acknowledged.
func (k *kit) produce(ctx context.Context, recs ...Record) error {
	krs := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		kr := &kgo.Record{Topic: k.cfg.Topic, Key: []byte(r.Key), Value: r.Value}
		for _, name := range slices.Sorted(maps.Keys(r.Headers)) {
			kr.Headers = append(kr.Headers, kgo.RecordHeader{Key: name, Value: []byte(r.Headers[name])})
		}
		krs[i] = kr
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	if err := k.client.ProduceSync(ctx, krs...).FirstErr(); err != nil {
		return fmt.Errorf("conform: produce to %s: %w", k.cfg.Topic, err)
	}
	return nil
}

// consume reads the reply and poison topics into k until ctx ends.
func (k *kit) consume(ctx context.Context) {
	for {
		fs := k.client.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		fs.EachError(func(t string, p int32, err error) { k.log("fetch %s/%d: %v", t, p, err) })
		k.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			h := map[string]string{}
			for _, x := range r.Headers {
				h[x.Key] = string(x.Value)
			}
			switch r.Topic {
			case k.cfg.ReplyTopic:
				id := h[core.MetadataSagaID]
				if strings.HasPrefix(id, k.runID) {
					k.replies[id] = append(k.replies[id], ObservedReply{Key: string(r.Key), Headers: h, Payload: r.Value})
				}
			case k.cfg.PoisonTopic:
				send, ok := h[HeaderSend]
				saga, index, _ := strings.Cut(send, "#")
				i, err := strconv.Atoi(index)
				if ok && err == nil && strings.HasPrefix(saga, k.runID) {
					if k.poisoned[saga] == nil {
						k.poisoned[saga] = map[int]bool{}
					}
					k.poisoned[saga][i] = true
				}
			}
		})
		close(k.changed)
		k.changed = make(chan struct{})
		k.mu.Unlock()
	}
}

// probed reports whether saga's probe was answered.
func (k *kit) probed(saga string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.ContainsFunc(k.replies[saga], func(r ObservedReply) bool { return r.Headers[core.MetadataSagaStep] == ProbeStep })
}

// waitFor waits until cond holds (checked under k.mu) or the timeout.
func (k *kit) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		ok, changed := cond(), k.changed
		k.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// waitProbes waits for the probes of sagas to be answered.
func (k *kit) waitProbes(ctx context.Context, sagas []string) error {
	missing := func() []string {
		var out []string
		for _, s := range sagas {
			if !slices.ContainsFunc(k.replies[s], func(r ObservedReply) bool { return r.Headers[core.MetadataSagaStep] == ProbeStep }) {
				out = append(out, s)
			}
		}
		return out
	}
	if k.waitFor(ctx, k.cfg.Timeout, func() bool { return len(missing()) == 0 }) {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return fmt.Errorf("no reply to the probe of %d saga(s) within %s (the participant stopped, or its replies are not shipped)", len(missing()), k.cfg.Timeout)
}

// waitPoisoned waits a little for the poisoned copies the cases expect:
// a participant may write them in a transaction of their own, which the
// relay can ship after the probe's reply.
func (k *kit) waitPoisoned(ctx context.Context, cases []Case) {
	k.waitFor(ctx, 15*time.Second, func() bool {
		for _, c := range cases {
			for _, i := range c.Poisoned {
				if !k.poisoned[k.sagaID(c)][i] {
					return false
				}
			}
		}
		return true
	})
}

// effects reads the participant's effects of this run, by saga id.
func (k *kit) effects(ctx context.Context) (map[string][]Effect, error) {
	rows, err := k.cfg.Pool.Query(ctx, k.cfg.Effects)
	if err != nil {
		return nil, fmt.Errorf("conform: the effects query: %w", err)
	}
	out := map[string][]Effect{}
	var (
		id string
		e  Effect
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &e.Step, &e.Operation, &e.Amount}, func() error {
		if strings.HasPrefix(id, k.runID) && e.Step != ProbeStep {
			out[id] = append(out[id], e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("conform: the effects query: %w", err)
	}
	return out, nil
}

// observed is what the participant did with saga's records.
func (k *kit) observed(saga string, effects map[string][]Effect) Observed {
	k.mu.Lock()
	defer k.mu.Unlock()
	o := Observed{Effects: effects[saga], Poisoned: map[int]bool{}}
	for _, r := range k.replies[saga] {
		if r.Headers[core.MetadataSagaStep] != ProbeStep {
			o.Replies = append(o.Replies, r)
		}
	}
	for i := range k.poisoned[saga] {
		o.Poisoned[i] = true
	}
	return o
}

// crashCase runs a case whose records crash the participant: it arms the
// crash file, sends them, waits for the participant to end, starts it
// again and checks that the records were handled once.
func (k *kit) crashCase(ctx context.Context, c Case) Result {
	start := time.Now()
	r := Result{Case: c.Name}
	defer func() { r.Took = time.Since(start) }()
	fail := func(format string, args ...any) Result {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
		r.Took = time.Since(start)
		return r
	}
	if err := os.WriteFile(k.p.crashFile, nil, 0o600); err != nil {
		return fail("arm the crash: %v", err)
	}
	id := k.sagaID(c)
	if err := k.produce(ctx, append(c.Records(id, k.cfg.ReplyTopic), Probe(id, k.cfg.ReplyTopic))...); err != nil {
		return fail("%v", err)
	}
	status, ok := k.p.waitExit(k.cfg.Timeout)
	switch {
	case !ok:
		return fail("the participant did not crash within %s: its action did not reach the crash point (the crash file is %s)", k.cfg.Timeout, EnvCrashFile)
	case status != CrashExitStatus:
		return fail("the participant ended with status %d, not %d (the crash point's)", status, CrashExitStatus)
	}
	if _, err := os.Stat(k.p.crashFile); err == nil {
		return fail("the participant crashed but left the crash file")
	}
	k.log("participant crashed as asked; starting it again")
	if err := k.p.start(); err != nil {
		return fail("start the participant again: %v", err)
	}
	if err := k.waitProbes(ctx, []string{id}); err != nil {
		return fail("after the restart: %v", err)
	}
	effects, err := k.effects(ctx)
	if err != nil {
		return fail("%v", err)
	}
	r.Problems = c.Check(id, k.observed(id, effects))
	return r
}

// process is the participant's process: the shell command, in a process
// group of its own so that stopping it stops what it started.
type process struct {
	run, log, crashFile string
	env                 []string

	cmd    *exec.Cmd
	exited chan struct{}
	status int
}

func (p *process) start() error {
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "--- %s: starting %s\n", time.Now().Format(time.RFC3339Nano), p.run)
	cmd := exec.Command("/bin/sh", "-c", p.run)
	cmd.Env = append(append(os.Environ(), p.env...), EnvCrashFile+"="+p.crashFile)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("conform: start %q: %w", p.run, err)
	}
	p.cmd, p.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		p.status = cmd.ProcessState.ExitCode()
		// What the shell started goes with it.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		close(p.exited)
	}()
	return nil
}

// waitExit waits for the process to end and returns its exit status.
func (p *process) waitExit(timeout time.Duration) (int, bool) {
	select {
	case <-p.exited:
		return p.status, true
	case <-time.After(timeout):
		return 0, false
	}
}

// stop ends the process group: SIGTERM, then SIGKILL after 10 seconds.
func (p *process) stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

// dumpLog writes the last lines of the participant's output to w.
func (p *process) dumpLog(w io.Writer) {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	fmt.Fprintf(w, "conform: the participant's last output:\n  %s\n", strings.Join(lines, "\n  "))
}

// PrintResults writes results as a table and a closing line, "N passed,
// M failed".
func PrintResults(w io.Writer, results []Result) (failed int) {
	width := len("CASE")
	for _, r := range results {
		width = max(width, len(r.Case))
	}
	fmt.Fprintf(w, "%-*s  %-6s  %s\n", width, "CASE", "RESULT", "DETAIL")
	for _, r := range results {
		if r.Passed() {
			fmt.Fprintf(w, "%-*s  %s\n", width, r.Case, "PASS")
			continue
		}
		failed++
		for i, p := range r.Problems {
			name, res := r.Case, "FAIL"
			if i > 0 {
				name, res = "", ""
			}
			fmt.Fprintf(w, "%-*s  %-6s  %s\n", width, name, res, p)
		}
	}
	fmt.Fprintf(w, "%d passed, %d failed\n", len(results)-failed, failed)
	return failed
}
