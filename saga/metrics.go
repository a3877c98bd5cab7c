package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/millrace/millrace/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts what orchestrators do and reads the sagas in flight, as a
// Prometheus collector, registered with Config.metrics; orchestrators that
// share a Registerer share it. A nil *metrics counts nothing.
//
// The series, all prefixed millrace_saga_ and labelled by saga type
// unless said otherwise:
//
//	started_total               sagas started
//	completed_total             sagas completed
//	compensated_total           sagas compensated
//	stuck_total                 times a saga became stuck
//	fenced_replies_total        replies recorded and ignored (stale, duplicate attempt, ended saga)
//	unregistered_total          sagas found on a definition version not registered (parked as stuck)
//	poisoned_total              replies sent to the poison topic (label topic only, the reply topic)
//	step_latency_seconds        from a step's first command to its success (histogram, also by step)
//	reply_batch_size            replies a RunBatched transaction takes (histogram, no label)
//	in_flight                   sagas running or compensating (gauge)
//	stuck                       sagas stuck now (gauge)
//	no_progress                 live sagas not changed for longer than the threshold (gauge)
//
// Counters are counted when the change commits (for StartTx: when it
// returns, as the caller commits). The gauges are read at scrape time with
// one query over saga_instance's status index.
type metrics struct {
	started, completed, compensated, stuck, fenced, unregistered *prometheus.CounterVec
	poisonedVec                                                  *prometheus.CounterVec
	stepLatency                                                  *prometheus.HistogramVec
	replyBatchSize                                               prometheus.Histogram

	gauges    *gaugeReader
	inFlight  *prometheus.Desc
	stuckNow  *prometheus.Desc
	noProgres *prometheus.Desc
}

type gaugeReader struct {
	o         *Orchestrator
	threshold time.Duration
}

// newMetrics returns the saga collector.
func newMetrics() *metrics {
	var constLabels prometheus.Labels
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "saga", Name: name, Help: help, ConstLabels: constLabels,
		}, []string{"type"})
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("millrace", "saga", name), help, []string{"type"}, constLabels)
	}
	return &metrics{
		started:      counter("started_total", "Sagas started."),
		completed:    counter("completed_total", "Sagas completed."),
		compensated:  counter("compensated_total", "Sagas compensated."),
		stuck:        counter("stuck_total", "Times a saga became stuck."),
		fenced:       counter("fenced_replies_total", "Saga replies recorded and ignored (fenced)."),
		unregistered: counter("unregistered_total", "Sagas found on a definition version that is not registered."),
		// By reply topic only: a poisoned reply's saga type may be anything.
		poisonedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "saga", Name: "poisoned_total", ConstLabels: constLabels,
			Help: "Saga replies sent to the poison topic (not a saga reply, no usable event id).",
		}, []string{"topic"}),
		stepLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "millrace", Subsystem: "saga", Name: "step_latency_seconds", ConstLabels: constLabels,
			Help:    "Time from a saga step's first command to its success.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"type", "step"}),
		replyBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "millrace", Subsystem: "saga", Name: "reply_batch_size", ConstLabels: constLabels,
			Help:    "Replies a RunBatched transaction takes (before a failed batch falls back to one per transaction).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}),
		inFlight:  desc("in_flight", "Sagas running or compensating."),
		stuckNow:  desc("stuck", "Sagas stuck now."),
		noProgres: desc("no_progress", "Live sagas with no change for longer than the no-progress threshold."),
	}
}

// registerMetrics registers the collector of o, which reads the
// in_flight, stuck and no_progress gauges from o's schema at scrape time (a
// live saga with no change for longer than threshold counts as no
// progress), with reg; the collector another orchestrator registered
// there before is shared.
func registerMetrics(reg prometheus.Registerer, o *Orchestrator, threshold time.Duration) (*metrics, error) {
	m := newMetrics()
	m.gauges = &gaugeReader{o: o, threshold: threshold}
	return promreg.Register(reg, m)
}

func (m *metrics) counters() []prometheus.Collector {
	return []prometheus.Collector{m.started, m.completed, m.compensated, m.stuck, m.fenced, m.unregistered, m.poisonedVec, m.stepLatency, m.replyBatchSize}
}

func (m *metrics) poisoned(topic string) {
	if m != nil {
		m.poisonedVec.WithLabelValues(topic).Inc()
	}
}

func (m *metrics) replyBatch(n int) {
	if m != nil {
		m.replyBatchSize.Observe(float64(n))
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.counters() {
		c.Describe(ch)
	}
	ch <- m.inFlight
	ch <- m.stuckNow
	ch <- m.noProgres
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.counters() {
		c.Collect(ch)
	}
	if m.gauges == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	o := m.gauges.o
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT type,
       count(*) FILTER (WHERE status IN ('running', 'compensating')),
       count(*) FILTER (WHERE status = 'stuck'),
       count(*) FILTER (WHERE status IN ('running', 'compensating') AND updated_at < $1)
  FROM %s WHERE status IN ('running', 'compensating', 'stuck') GROUP BY type`, o.sql.instance),
		o.clock.Now().Add(-m.gauges.threshold))
	if err != nil {
		ch <- prometheus.NewInvalidMetric(m.inFlight, err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var typ string
		var live, stuck, stale int64
		if err := rows.Scan(&typ, &live, &stuck, &stale); err != nil {
			ch <- prometheus.NewInvalidMetric(m.inFlight, err)
			return
		}
		ch <- prometheus.MustNewConstMetric(m.inFlight, prometheus.GaugeValue, float64(live), typ)
		ch <- prometheus.MustNewConstMetric(m.stuckNow, prometheus.GaugeValue, float64(stuck), typ)
		ch <- prometheus.MustNewConstMetric(m.noProgres, prometheus.GaugeValue, float64(stale), typ)
	}
}
