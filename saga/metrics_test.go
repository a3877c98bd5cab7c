package saga_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/millrace/millrace/core"
)

// counterValue sums a metric's series in m.
func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			sum += value(mt)
		}
	}
	return sum
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return 0
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	metrics := prometheus.NewPedanticRegistry()
	clock := newManualClock()
	b := setup(t, bundleOptions{clock: clock, metrics: metrics, noProgressAfter: time.Minute})
	def := mustDefine(t, orderSpec(b, 1))
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b, clock: clock, handler: b.o.Handler()}
	for _, id := range []string{"m-ok", "m-comp", "m-live"} {
		start(t, b, def, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess)
	}
	clock.Advance(10 * time.Millisecond)
	d.reply("m-ok", d.last("m-ok"), core.OutcomeSuccess)
	d.reply("m-ok", d.last("m-ok"), core.OutcomeSuccess) // fenced
	d.reply("m-comp", d.last("m-comp"), core.OutcomeFailure)
	d.reply("m-comp", d.last("m-comp"), core.OutcomeSuccess)
	clock.Advance(2 * time.Minute) // m-live makes no progress
	want := map[string]float64{
		"millrace_saga_started_total": 3, "millrace_saga_completed_total": 1, "millrace_saga_compensated_total": 1,
		"millrace_saga_stuck_total": 0, "millrace_saga_fenced_replies_total": 1,
		"millrace_saga_in_flight": 1, "millrace_saga_no_progress": 1,
		// credit of each saga, stock of m-ok: 4 steps done (approve is local)
		"millrace_saga_step_latency_seconds": 4 + 3,
	}
	for name, v := range want {
		if got := counterValue(t, metrics, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
}
