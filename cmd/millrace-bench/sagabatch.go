package main

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// batchMeter counts the transactions of a saga rig's three batching
// components and the messages they carried, through the library's own
// instruments, which the service registers (Config.Metrics): the
// Prometheus histograms of the relay, the participants and the
// orchestrator (millrace_outbox_batch_size,
// millrace_compensation_batch_size, millrace_saga_reply_batch_size).
type batchMeter struct {
	reg *prometheus.Registry // the service's Config.Metrics
}

func newBatchMeter(reg *prometheus.Registry) *batchMeter { return &batchMeter{reg: reg} }

// batchCounts are a batchMeter's reading: per component, transactions and
// messages.
type batchCounts map[string][2]float64

func (m *batchMeter) read() (batchCounts, error) {
	mfs, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	c := batchCounts{}
	for _, mf := range mfs {
		var k string
		switch mf.GetName() {
		case "millrace_outbox_batch_size":
			k = "relay"
		case "millrace_compensation_batch_size":
			k = "participants"
		case "millrace_saga_reply_batch_size":
			k = "orchestrator"
		default:
			continue
		}
		for _, s := range mf.GetMetric() {
			h := s.GetHistogram()
			v := c[k]
			c[k] = [2]float64{v[0] + float64(h.GetSampleCount()), v[1] + h.GetSampleSum()}
		}
	}
	return c, nil
}

// meanBatches is the messages per transaction of each component between
// two readings (components with no transaction between them left out).
func meanBatches(before, after batchCounts) map[string]float64 {
	out := map[string]float64{}
	for k, a := range after {
		n, msgs := a[0]-before[k][0], a[1]-before[k][1]
		if n > 0 {
			out[k] = round(msgs/n, 2)
		}
	}
	return out
}

// batchesLine is meanBatches for a progress line.
func batchesLine(mean map[string]float64) string {
	return fmt.Sprintf("messages per transaction: relay %.2f, participants %.2f, orchestrator %.2f",
		mean["relay"], mean["participants"], mean["orchestrator"])
}
