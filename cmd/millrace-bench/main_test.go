package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/leaktest"
)

// TestMain runs main instead of the tests when the bench re-executes this
// binary as its broker or relay child.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		main()
		os.Exit(0)
	}
	leaktest.VerifyTestMain(m)
}

// TestQuickRun runs the whole program in quick mode with a tiny backlog and
// one-second phases, against the real database and an embedded broker in a
// child process, and checks that results.json holds every figure. Its saga
// throughput comes from a fixed number of sagas run to completion (a saga
// takes seconds on a loaded machine, longer than a phase): the run fails if
// they do not all complete. It does
// not call t.Parallel: it sets BENCH_QUICK, and it is the package's only test.
func TestQuickRun(t *testing.T) {
	t.Setenv("BENCH_QUICK", "1")
	t.Setenv("KAFKA_BROKERS", "") // the embedded broker child is part of what is tested
	out := filepath.Join(t.TempDir(), "results.json")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{"-n", "2000", "-duration", "1s", "-out", out}, &stdout, &stderr)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if err != nil {
		t.Fatal(err)
	}

	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var res map[string]any
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("results.json: %v\n%s", err, data)
	}
	for _, name := range figureOrder {
		v, ok := res[name].(float64)
		if !ok || !(v > 0) {
			t.Errorf("figure %s = %v, want a number > 0", name, res[name])
		}
	}
	if q, _ := res["quick"].(bool); !q {
		t.Errorf("quick = %v, want true", res["quick"])
	}
	cfg, _ := res["config"].(map[string]any)
	if n, _ := cfg["n"].(float64); n != 2000 {
		t.Errorf("config.n = %v, want 2000", cfg["n"])
	}
	if n, _ := cfg["saga_quick_sagas"].(float64); n != sagaQuickCount {
		t.Errorf("config.saga_quick_sagas = %v, want %d", cfg["saga_quick_sagas"], sagaQuickCount)
	}
	// The saga phases' meters: this process, the broker child and the
	// local PostgreSQL all did work, and the machine's wake-up was timed.
	for _, k := range []string{"saga_cpu_ms_per_saga_bench_process", "saga_cpu_ms_per_saga_broker", "saga_cpu_ms_per_saga_postgres",
		"saga_wakeups_per_saga_bench_process", "saga_wakeups_per_saga_broker",
		"saga_latency_cpu_ms_per_saga_postgres", "saga_latency_wakeups_per_saga_postgres", "machine_wakeup_round_trip_us", "machine_cpu_probe_ms"} {
		if v, _ := cfg[k].(float64); !(v > 0) {
			t.Errorf("config.%s = %v, want a number > 0", k, cfg[k])
		}
	}
	// Each latency phase (one in quick mode) has the CPU probe read before it.
	if probes, _ := cfg["saga_latency_phase_cpu_probe_ms"].([]any); len(probes) != 1 || !(probes[0].(float64) > 0) {
		t.Errorf("config.saga_latency_phase_cpu_probe_ms = %v, want one time > 0", cfg["saga_latency_phase_cpu_probe_ms"])
	}
	// What the latency phase's components sent: statements of every group
	// (a group at 0 is a statement whose text no longer matches its
	// group), and messages per transaction from the components' metrics.
	stmts, _ := cfg["saga_latency_pg_statements_per_saga"].(map[string]any)
	for _, g := range append(pgStatementGroups(), "begin_commit", "total") {
		if v, _ := stmts[g].(float64); !(v > 0) {
			t.Errorf("config.saga_latency_pg_statements_per_saga[%s] = %v, want a number > 0 (all: %v)", g, stmts[g], stmts)
		}
	}
	per, _ := cfg["saga_latency_messages_per_transaction"].(map[string]any)
	for _, k := range []string{"relay", "participants", "orchestrator"} {
		if v, _ := per[k].(float64); !(v >= 1) {
			t.Errorf("config.saga_latency_messages_per_transaction[%s] = %v, want a number >= 1 (all: %v)", k, per[k], per)
		}
	}
	for _, k := range []string{"go", "time"} {
		if s, _ := res[k].(string); s == "" {
			t.Errorf("%s missing", k)
		}
	}
	if !bytes.Contains(stdout.Bytes(), []byte("relay_vs_forwarder")) {
		t.Errorf("the table on stdout has no relay_vs_forwarder row")
	}
}

// TestFlags checks the command line: -only, defaults and quick sizes.
func TestFlags(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"-only", "relay, raw", "-n", "5"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.only) != 2 || o.only[0] != "relay" || o.only[1] != "raw" || o.n != 5 {
		t.Fatalf("parsed %+v", o)
	}
	if _, err := parseFlags([]string{"-only", "nope"}, &stderr); err == nil {
		t.Fatal("unknown group accepted")
	}
	if o.out != "" {
		t.Fatalf("-only without -out writes %q; want no file, so that a part does not replace the committed results", o.out)
	}
	if full, err := parseFlags(nil, &stderr); err != nil || full.out != defaultOut {
		t.Fatalf("a full run writes %q (%v); want %s", full.out, err, defaultOut)
	}
	if o.sagaRate != 200 {
		t.Fatalf("-saga-rate defaults to %d, want 200 (the target's rate)", o.sagaRate)
	}
	if _, err := parseFlags([]string{"-saga-rate", "3"}, &stderr); err == nil {
		t.Fatal("-saga-rate 3 accepted: its quarter-rate phase would start no saga")
	}
	if p := payloadOf(123456); len(p) != payloadSize || !json.Valid(p) {
		t.Fatalf("payload %q: %d bytes, valid JSON %v", p, len(p), json.Valid(p))
	}
}
