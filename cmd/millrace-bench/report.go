package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"text/tabwriter"
	"time"
)

// target is the figure's target, as the README's Performance table shows it.
type target struct {
	atLeast bool // true: value >= limit; false: value <= limit
	limit   float64
}

var targets = map[string]target{
	"relay_vs_forwarder":  {true, 10},
	"relay_vs_raw":        {true, 0.8},
	"latency_p50_ms":      {false, 5},
	"latency_p99_ms":      {false, 10},
	"write_ratio":         {true, 0.9},
	"relay_rss_mib":       {false, 64},
	"dedup_ratio":         {true, 0.85},
	"sagas_per_s":         {true, 1500},
	"saga_latency_p50_ms": {false, 20},
	"saga_latency_p99_ms": {false, 50},
	"write_ratio_cdc":     {true, 0.95},
	"consumer_vs_wkafka":  {true, 3},
}

// figureOrder is the order of the table; every figure the bench can produce
// is listed.
var figureOrder = []string{
	"relay_events_per_s", "forwarder_events_per_s", "raw_produce_events_per_s",
	"relay_vs_forwarder", "relay_vs_raw", "relay_rss_mib",
	"latency_p50_ms", "latency_p99_ms", "baseline_poll_latency_p50_ms", "baseline_poll_latency_p99_ms",
	"write_ratio", "write_tps_outbox", "write_tps_plain",
	"dedup_ratio", "inbox_accept_events_per_s",
	"sagas_per_s", "sagas_per_s_wait_step", "saga_latency_p50_ms", "saga_latency_p99_ms",
	"cdc_relay_events_per_s", "cdc_vs_relay", "write_ratio_cdc", "cdc_latency_p50_ms", "cdc_latency_p99_ms",
	"consumer_batched_1p_per_s", "consumer_batched_32p_per_s", "consumer_wkafka_1p_per_s", "consumer_wkafka_32p_per_s",
	"consumer_vs_wkafka",
}

// ratios adds the figures derived from others in the same run.
func (b *bench) ratios() {
	relay, okR := b.results["relay_events_per_s"]
	if fwd, ok := b.results["forwarder_events_per_s"]; ok && okR && fwd > 0 {
		b.results["relay_vs_forwarder"] = round(relay/fwd, 2)
	}
	if raw, ok := b.results["raw_produce_events_per_s"]; ok && okR && raw > 0 {
		b.results["relay_vs_raw"] = round(relay/raw, 3)
	}
	if cdc, ok := b.results["cdc_relay_events_per_s"]; ok && okR && relay > 0 {
		b.results["cdc_vs_relay"] = round(cdc/relay, 2)
	}
	batched, okB := b.results["consumer_batched_32p_per_s"]
	if wk, ok := b.results["consumer_wkafka_32p_per_s"]; ok && okB && wk > 0 {
		b.results["consumer_vs_wkafka"] = round(batched/wk, 2)
	}
}

func printTable(w io.Writer, b *bench) {
	fmt.Fprintf(w, "\nmillrace bench (%s, n=%d, phases of %s, %s)\n\n", modeName(b.opts.quick), b.opts.n, b.opts.duration, runtime.Version())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "figure\tvalue\ttarget\tmet?\t")
	fmt.Fprintln(tw, "------\t-----\t------\t----\t")
	for _, name := range figureOrder {
		v, ok := b.results[name]
		if !ok {
			continue
		}
		t, hasTarget := targets[name]
		tgt, met := "-", "-"
		if hasTarget {
			op := "<="
			if t.atLeast {
				op = ">="
			}
			tgt = fmt.Sprintf("%s %g", op, t.limit)
			met = "no"
			if (t.atLeast && v >= t.limit) || (!t.atLeast && v <= t.limit) {
				met = "yes"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", name, formatValue(v), tgt, met)
	}
	tw.Flush()
	if _, ok := b.results["saga_hop_start_p50_ms"]; ok {
		fmt.Fprintf(w, "\nsaga round trip at %v sagas/s, per hop (saga_hop_<hop>_p50_ms / _p99_ms):\n", b.config["saga_latency_rate_per_s"])
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "hop\tp50 ms\tp99 ms\t")
		for _, h := range hopNames {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\n", h, formatValue(b.results["saga_hop_"+h+"_p50_ms"]), formatValue(b.results["saga_hop_"+h+"_p99_ms"]))
		}
		tw.Flush()
	}
	for _, n := range b.notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func modeName(quick bool) string {
	if quick {
		return "quick"
	}
	return "full"
}

func formatValue(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

// writeJSON writes the flat object: figure -> number, plus quick, config, go
// and time.
func (b *bench) writeJSON(path string) error {
	if len(b.notes) > 0 {
		b.config["notes"] = b.notes
	}
	out := map[string]any{}
	for k, v := range b.results {
		out[k] = v
	}
	out["quick"] = b.opts.quick
	out["config"] = b.config
	out["go"] = runtime.Version()
	out["time"] = time.Now().UTC().Format(time.RFC3339)
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}
