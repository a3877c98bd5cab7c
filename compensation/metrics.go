package compensation

import (
	"github.com/millrace/millrace/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts what participants do, by participant and command, as a
// Prometheus collector registered with Config.metrics; participants that
// share a Registerer share it. A nil *metrics counts nothing.
//
// The series, all prefixed millrace_compensation_:
//
//	actions_total               action functions run (whatever their outcome)
//	compensations_total         compensations run against an action's effect
//	empty_compensations_total   compensations that found no action to undo (recorded, no effect)
//	late_actions_total          actions that arrived after their compensation (cancelled, not run)
//	business_failures_total     business failures returned (label operation)
//	duplicates_total            repeated commands answered from the barrier (label operation)
//	poisoned_total              commands sent to the poison topic (label participant only)
//	batch_size                  commands a RunBatched transaction takes (histogram, label participant only)
//
// A count is taken when the handler returns, before its transaction
// commits: a commit that then fails (and is retried) may count twice.
type metrics struct {
	actions, compensations, empties, lates, failures, duplicates *prometheus.CounterVec
	poisonedVec                                                  *prometheus.CounterVec
	batchSize                                                    *prometheus.HistogramVec
}

// registerMetrics registers the participants' collector with reg, or
// returns the one another participant registered there before.
func registerMetrics(reg prometheus.Registerer) (*metrics, error) {
	return promreg.Register(reg, newMetrics())
}

// newMetrics returns the participants' collector.
func newMetrics() *metrics {
	var constLabels prometheus.Labels
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "compensation", Name: name, Help: help, ConstLabels: constLabels,
		}, append([]string{"participant", "command"}, labels...))
	}
	return &metrics{
		actions:       vec("actions_total", "Saga action functions run."),
		compensations: vec("compensations_total", "Saga compensations run against an action's effect."),
		empties:       vec("empty_compensations_total", "Saga compensations that found no action to undo."),
		lates:         vec("late_actions_total", "Saga actions that arrived after their compensation and were cancelled."),
		failures:      vec("business_failures_total", "Business failures returned by saga actions and compensations.", "operation"),
		duplicates:    vec("duplicates_total", "Repeated saga commands answered from the barrier.", "operation"),
		// By participant only: a poisoned command's name may be anything.
		poisonedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "compensation", Name: "poisoned_total", ConstLabels: constLabels,
			Help: "Saga commands sent to the poison topic (malformed, unknown, unanswerable).",
		}, []string{"participant"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "millrace", Subsystem: "compensation", Name: "batch_size", ConstLabels: constLabels,
			Help:    "Commands a RunBatched transaction takes (before a failed batch falls back to one per transaction).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 11),
		}, []string{"participant"}),
	}
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.actions, m.compensations, m.empties, m.lates, m.failures, m.duplicates, m.poisonedVec, m.batchSize}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range m.all() {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	for _, v := range m.all() {
		v.Collect(ch)
	}
}

func (m *metrics) action(participant, command string) {
	if m != nil {
		m.actions.WithLabelValues(participant, command).Inc()
	}
}

func (m *metrics) compensation(participant, command string) {
	if m != nil {
		m.compensations.WithLabelValues(participant, command).Inc()
	}
}

func (m *metrics) empty(participant, command string) {
	if m != nil {
		m.empties.WithLabelValues(participant, command).Inc()
	}
}

func (m *metrics) late(participant, command string) {
	if m != nil {
		m.lates.WithLabelValues(participant, command).Inc()
	}
}

func (m *metrics) failure(participant, command, operation string) {
	if m != nil {
		m.failures.WithLabelValues(participant, command, operation).Inc()
	}
}

func (m *metrics) duplicate(participant, command, operation string) {
	if m != nil {
		m.duplicates.WithLabelValues(participant, command, operation).Inc()
	}
}

func (m *metrics) poisoned(participant string) {
	if m != nil {
		m.poisonedVec.WithLabelValues(participant).Inc()
	}
}

func (m *metrics) batch(participant string, n int) {
	if m != nil {
		m.batchSize.WithLabelValues(participant).Observe(float64(n))
	}
}
