package outbox

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics counts what relays do and reads the size of the backlog, as a
// Prometheus collector. Register it with a prometheus.Registerer and pass it
// to RelayConfig.Metrics; one Metrics can serve several relays. A nil
// *Metrics counts nothing.
//
// The series, all prefixed millrace_outbox_:
//
//	published_total                events published (rate() gives events per second)
//	failures_total                 failed publish attempts of single events
//	dead_lettered_total            events moved to the dead-letter state
//	outages_total                  batches that failed as a whole (broker or database unavailable)
//	pending                        events waiting to be published (gauge; estimated above Admin's count limit)
//	oldest_pending_age_seconds     age of the oldest waiting event (gauge; alert on this)
//	dead_letters                   events in the dead-letter state (gauge)
//
// The gauges are read at scrape time with Admin.Stats: one cheap query, no
// count(*) over the log.
type Metrics struct {
	published, failures, deadLettered, outages prometheus.Counter

	admin                         *Admin
	pendingDesc, oldestDesc, dead *prometheus.Desc
}

// NewMetrics returns the outbox's collector. admin, when not nil, feeds the
// backlog gauges. constLabels (may be nil) are added to every series, for
// example {"service": "orders"}.
func NewMetrics(admin *Admin, constLabels prometheus.Labels) *Metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "outbox", Name: name, Help: help, ConstLabels: constLabels,
		})
	}
	gauge := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("millrace", "outbox", name), help, nil, constLabels)
	}
	return &Metrics{
		published:    counter("published_total", "Outbox events published."),
		failures:     counter("failures_total", "Failed publish attempts of single outbox events."),
		deadLettered: counter("dead_lettered_total", "Outbox events moved to the dead-letter state."),
		outages:      counter("outages_total", "Relay batches that failed as a whole (broker or database unavailable)."),
		admin:        admin,
		pendingDesc:  gauge("pending", "Outbox events waiting to be published."),
		oldestDesc:   gauge("oldest_pending_age_seconds", "Age of the oldest outbox event waiting to be published."),
		dead:         gauge("dead_letters", "Outbox events in the dead-letter state."),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	if m.admin != nil {
		ch <- m.pendingDesc
		ch <- m.oldestDesc
		ch <- m.dead
	}
}

// Collect implements prometheus.Collector. It reads the backlog gauges from
// the database, waiting at most five seconds.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	if m.admin == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := m.admin.Stats(ctx)
	if err != nil {
		for _, d := range []*prometheus.Desc{m.pendingDesc, m.oldestDesc, m.dead} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(st.Pending))
	ch <- prometheus.MustNewConstMetric(m.oldestDesc, prometheus.GaugeValue, st.OldestPendingAge.Seconds())
	ch <- prometheus.MustNewConstMetric(m.dead, prometheus.GaugeValue, float64(st.Dead))
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
