package outbox

import (
	"context"
	"time"

	"github.com/millrace/millrace/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts what relays do and reads the size of the backlog, as a
// Prometheus collector registered with RelayConfig.metrics; relays that
// share a Registerer share it. A nil *metrics counts nothing.
//
// The series, all prefixed millrace_outbox_:
//
//	published_total                events published (rate() gives events per second)
//	failures_total                 failed publish attempts of single events
//	dead_lettered_total            events moved to the dead-letter state
//	outages_total                  batches that failed as a whole (broker or database unavailable)
//	batch_size                     events a batch published or tried to, one transaction (histogram)
//	pending                        events waiting to be published (gauge; estimated above Admin's count limit)
//	oldest_pending_age_seconds     age of the oldest waiting event (gauge; alert on this)
//	dead_letters                   events in the dead-letter state (gauge)
//
// and for change data capture (CDCRelay):
//
//	cdc_slot_lag_bytes             WAL the server holds for the CDC slot (gauge; alert on this)
//	cdc_slot_active                1 while a CDC relay streams from the slot (gauge)
//	cdc_slot_invalidated           1 while the slot is invalidated, until a CDC relay recovers (gauge)
//	cdc_slot_age_seconds           age of the oldest transaction a CDC relay has read and not confirmed (gauge, set by the relay; 0 when caught up)
//	cdc_slot_invalidations_total   invalidated slots a CDC relay recovered from
//
// The gauges are read at scrape time with Admin.Stats and Admin.SlotStats
// (the slot of AdminConfig.CDCSlot; the three slot gauges are left out
// while it does not exist): cheap queries, no count(*) over the log.
type metrics struct {
	published, failures, deadLettered, outages prometheus.Counter
	slotInvalidations                          prometheus.Counter
	slotAgeSeconds                             prometheus.Gauge
	batchSize                                  prometheus.Histogram

	admin                         *Admin
	pendingDesc, oldestDesc, dead *prometheus.Desc
	lagDesc, activeDesc, lostDesc *prometheus.Desc
}

// registerMetrics registers the outbox's collector, whose backlog gauges
// admin feeds, with reg, or returns the one another relay registered
// there before.
func registerMetrics(reg prometheus.Registerer, admin *Admin) (*metrics, error) {
	return promreg.Register(reg, newMetrics(admin))
}

// newMetrics returns the outbox's collector; admin, when not nil, feeds the
// backlog gauges.
func newMetrics(admin *Admin) *metrics {
	var constLabels prometheus.Labels
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "millrace", Subsystem: "outbox", Name: name, Help: help, ConstLabels: constLabels,
		})
	}
	gauge := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("millrace", "outbox", name), help, nil, constLabels)
	}
	return &metrics{
		published:         counter("published_total", "Outbox events published."),
		failures:          counter("failures_total", "Failed publish attempts of single outbox events."),
		deadLettered:      counter("dead_lettered_total", "Outbox events moved to the dead-letter state."),
		outages:           counter("outages_total", "Relay batches that failed as a whole (broker or database unavailable)."),
		slotInvalidations: counter("cdc_slot_invalidations_total", "Invalidated CDC replication slots a CDC relay recovered from."),
		slotAgeSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "millrace", Subsystem: "outbox", Name: "cdc_slot_age_seconds", ConstLabels: constLabels,
			Help: "Age of the oldest transaction a CDC relay has read from its slot and not yet confirmed (0 when caught up).",
		}),
		// 1, 2, 4, ... 4096: past RelayConfig.BatchSize's default (2000).
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "millrace", Subsystem: "outbox", Name: "batch_size", ConstLabels: constLabels,
			Help:    "Events a relay batch published or tried to publish, in one transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		lagDesc:     gauge("cdc_slot_lag_bytes", "WAL the server holds for the CDC replication slot."),
		activeDesc:  gauge("cdc_slot_active", "1 while a CDC relay streams from the replication slot."),
		lostDesc:    gauge("cdc_slot_invalidated", "1 while the CDC replication slot is invalidated (until a CDC relay recovers)."),
		admin:       admin,
		pendingDesc: gauge("pending", "Outbox events waiting to be published."),
		oldestDesc:  gauge("oldest_pending_age_seconds", "Age of the oldest outbox event waiting to be published."),
		dead:        gauge("dead_letters", "Outbox events in the dead-letter state."),
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	if m.admin != nil {
		ch <- m.pendingDesc
		ch <- m.oldestDesc
		ch <- m.dead
		ch <- m.lagDesc
		ch <- m.activeDesc
		ch <- m.lostDesc
	}
}

// Collect implements prometheus.Collector. It reads the backlog gauges from
// the database, waiting at most five seconds.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
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
	slot, err := m.admin.SlotStats(ctx, m.admin.cdcSlot)
	if err != nil {
		for _, d := range []*prometheus.Desc{m.lagDesc, m.activeDesc, m.lostDesc} {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	if slot.Name == "" {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.lagDesc, prometheus.GaugeValue, float64(slot.LagBytes))
	ch <- prometheus.MustNewConstMetric(m.activeDesc, prometheus.GaugeValue, boolGauge(slot.Active))
	ch <- prometheus.MustNewConstMetric(m.lostDesc, prometheus.GaugeValue, boolGauge(slot.WALStatus == "lost"))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.failures, m.deadLettered, m.outages, m.slotInvalidations, m.slotAgeSeconds, m.batchSize}
}

// batch counts a committed batch: published events reached the broker,
// back went back to the pending set (failed, some dead-lettered); the
// batch sent both.
func (m *metrics) batch(published int, back unclaimed) {
	if m == nil {
		return
	}
	if sent := published + len(back.ids); sent > 0 {
		m.batchSize.Observe(float64(sent))
	}
	m.published.Add(float64(published))
	m.failures.Add(float64(back.charged))
	m.deadLettered.Add(float64(back.died))
}

func (m *metrics) outage() {
	if m == nil {
		return
	}
	m.outages.Inc()
}

func (m *metrics) slotInvalidated() {
	if m == nil {
		return
	}
	m.slotInvalidations.Inc()
}

// slotAge sets the age gauge to the time since oldest, 0 for the zero time.
func (m *metrics) slotAge(oldest time.Time) {
	if m == nil {
		return
	}
	age := 0.0
	if !oldest.IsZero() {
		age = max(0, time.Since(oldest).Seconds())
	}
	m.slotAgeSeconds.Set(age)
}
