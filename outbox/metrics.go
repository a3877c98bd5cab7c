package outbox

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts what relays do, as Prometheus collectors. Register it with
// a prometheus.Registerer and pass it to RelayConfig.Metrics; one Metrics
// can serve several relays. A nil *Metrics counts nothing.
//
// The collected series, all prefixed millrace_outbox_:
//
//	published_total       events published (rate() gives events per second)
//	failures_total        failed publish attempts of single events
//	dead_lettered_total   events moved to the dead-letter state
//	outages_total         batches that failed as a whole (broker or database unavailable)
type Metrics struct {
	published, failures, deadLettered, outages prometheus.Counter
}

// NewMetrics returns relay counters. constLabels (may be nil) are added to
// every series, for example {"service": "orders"}.
func NewMetrics(constLabels prometheus.Labels) *Metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "outbox", Name: name, Help: help, ConstLabels: constLabels,
		})
	}
	return &Metrics{
		published:    counter("published_total", "Outbox events published."),
		failures:     counter("failures_total", "Failed publish attempts of single outbox events."),
		deadLettered: counter("dead_lettered_total", "Outbox events moved to the dead-letter state."),
		outages:      counter("outages_total", "Relay batches that failed as a whole (broker or database unavailable)."),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.failures, m.deadLettered, m.outages}
}

func (m *Metrics) batch(published, failed, dead int) {
	if m == nil {
		return
	}
	m.published.Add(float64(published))
	m.failures.Add(float64(failed))
	m.deadLettered.Add(float64(dead))
}

func (m *Metrics) outage() {
	if m == nil {
		return
	}
	m.outages.Inc()
}
