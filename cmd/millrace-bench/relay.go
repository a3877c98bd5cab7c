package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// relayReport is what the -run-relay child prints on stdout, as one JSON line.
type relayReport struct {
	DrainNanos int64 `json:"drain_ns"`  // from relay start until outbox_pending is empty
	Published  int64 `json:"published"` // messages the publisher delivered
	VmHWMKiB   int64 `json:"vmhwm_kib"` // peak resident set size
}

// benchRelay measures relay_events_per_s and relay_rss_mib: a backlog of n
// events written first (not timed), then drained by one relay in a child
// process publishing through kafka.Publisher.
func (b *bench) benchRelay(ctx context.Context) error {
	pool, schema, done, err := b.workspace(ctx, 8)
	if err != nil {
		return err
	}
	defer done()
	topic := newTopic("relay")
	n := b.opts.n
	if err := b.writeBacklog(ctx, pool, schema, topic, n, outbox.WriterConfig{}); err != nil {
		return err
	}
	// The log is freshly written: let the relay start from analyzed tables,
	// as it would in a service that has been running.
	if _, err := pool.Exec(ctx, `ANALYZE `+sqlident.Table(schema, "outbox_event")+`, `+sqlident.Table(schema, "outbox_pending")); err != nil {
		return err
	}

	args := []string{"-run-relay", "-schema", schema, "-brokers", strings.Join(b.brokers, ","), "-n", strconv.Itoa(n)}
	if b.opts.relayWorkers > 0 {
		args = append(args, "-relay-workers", strconv.Itoa(b.opts.relayWorkers))
		b.config["relay_workers"] = b.opts.relayWorkers
	}
	if b.opts.relayBatch > 0 {
		args = append(args, "-relay-batch", strconv.Itoa(b.opts.relayBatch))
		b.config["relay_batch"] = b.opts.relayBatch
	}
	if b.opts.cpuprofile != "" {
		args = append(args, "-cpuprofile", b.opts.cpuprofile)
	}
	cmd, err := child(ctx, args...)
	if err != nil {
		return err
	}
	cmd.Env = append(cmd.Env, "DATABASE_URL="+b.dbURL)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	b.progress("relay: draining %d events in child process", n)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("relay child: %w", err)
	}
	var rep relayReport
	if err := json.Unmarshal(lastLine(stdout.Bytes()), &rep); err != nil {
		return fmt.Errorf("relay child report %q: %w", stdout.String(), err)
	}

	var pending int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Table(schema, "outbox_pending")).Scan(&pending); err != nil {
		return err
	}
	if pending != 0 {
		return fmt.Errorf("relay child reported done with %d events still pending", pending)
	}
	records, err := b.checkDelivered(topic, n)
	if err != nil {
		return err
	}
	if dup := records - int64(n); dup > 0 {
		b.config["relay_duplicates"] = dup
		b.note("the relay published %d duplicates (topic holds %d records for %d events); see the relay child's log above", dup, records, n)
	}
	drain := time.Duration(rep.DrainNanos)
	rate := float64(n) / drain.Seconds()
	b.results["relay_events_per_s"] = round(rate, 0)
	b.results["relay_rss_mib"] = round(float64(rep.VmHWMKiB)/1024, 1)
	b.progress("relay: %d events in %s = %.0f/s, peak RSS %.1f MiB", n, drain.Round(time.Millisecond), rate, float64(rep.VmHWMKiB)/1024)
	if b.opts.cpuprofile != "" {
		b.progress("relay: CPU profile in %s (go tool pprof %s)", b.opts.cpuprofile, b.opts.cpuprofile)
	}
	return nil
}

// runRelayChild is the -run-relay child: it drains the backlog in -schema
// with one relay, times it, and prints a relayReport on stdout.
func runRelayChild(ctx context.Context, o *options, stdout io.Writer) error {
	if o.schema == "" || o.brokers == "" {
		return fmt.Errorf("-run-relay needs -schema and -brokers")
	}
	pool, err := (&bench{dbURL: os.Getenv("DATABASE_URL")}).connect(ctx, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	kp, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: strings.Split(o.brokers, ",")}, nil)
	if err != nil {
		return err
	}
	defer kp.Close()
	pub := &countingPublisher{Publisher: kp}
	// Warnings and errors go to stderr: a retried batch is a duplicate,
	// and the parent reports duplicates.
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{
		Schema:    o.schema,
		Publisher: pub,
		Workers:   o.relayWorkers,
		BatchSize: o.relayBatch,
		Logger:    logger,
	})
	if err != nil {
		return err
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	rctx, stop := context.WithCancel(ctx)
	finished := make(chan struct{})
	var runErr error
	started := time.Now()
	go func() {
		defer close(finished)
		runErr = relay.Run(rctx)
	}()
	drained, err := waitDrained(ctx, pool, o.schema, pub, int64(o.n), finished)
	stop()
	<-finished
	if err == nil {
		err = runErr
	}
	if err != nil {
		return err
	}
	rep := relayReport{DrainNanos: int64(drained.Sub(started)), Published: pub.n.Load(), VmHWMKiB: vmHWM()}
	return json.NewEncoder(stdout).Encode(rep)
}

// waitDrained waits until the publisher has delivered n messages and then
// until outbox_pending is empty (the relay marks a batch after publishing
// it), and returns when it saw it empty. The probe is cheap: it runs only
// after the last publish, every 2ms.
func waitDrained(ctx context.Context, pool *pgxpool.Pool, schema string, pub *countingPublisher, n int64, relayFinished <-chan struct{}) (time.Time, error) {
	probe := `SELECT EXISTS (SELECT 1 FROM ` + sqlident.Table(schema, "outbox_pending") + `)`
	deadline := time.Now().Add(15 * time.Minute)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-relayFinished:
			return time.Time{}, fmt.Errorf("relay stopped before draining the backlog (%d of %d published)", pub.n.Load(), n)
		case now := <-tick.C:
			if now.After(deadline) {
				return time.Time{}, fmt.Errorf("backlog not drained after 15 minutes (%d of %d published)", pub.n.Load(), n)
			}
		}
		if pub.n.Load() < n {
			continue
		}
		var left bool
		if err := pool.QueryRow(ctx, probe).Scan(&left); err != nil {
			return time.Time{}, err
		}
		if !left {
			return time.Now(), nil
		}
	}
}

// vmHWM reads this process's peak resident set size from /proc, in KiB.
func vmHWM() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			v, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return v
		}
	}
	return 0
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	return lines[len(lines)-1]
}
