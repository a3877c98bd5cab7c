package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	reg := prometheus.NewPedanticRegistry()
	m := prometheus.WrapRegistererWith(prometheus.Labels{"service": "test"}, reg)
	// A relay registers the collector when it is made; the backlog gauges
	// read the log at scrape time, before any relay runs. The relay that
	// runs below shares the collector registered here.
	if _, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: &recorder{}, Metrics: m}); err != nil {
		t.Fatal(err)
	}
	poison, _ := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "bad", Payload: []byte(`{}`)})
	writeN(t, w, "t", 30, 3)

	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				if g := mf.GetMetric()[0].GetGauge(); g != nil {
					return g.GetValue()
				}
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatalf("no %s", name)
		return 0
	}
	if got := gauge("millrace_outbox_pending"); got != 31 {
		t.Fatalf("pending = %v, want 31", got)
	}
	time.Sleep(20 * time.Millisecond) // let the oldest event age measurably
	if got := gauge("millrace_outbox_oldest_pending_age_seconds"); got <= 0 {
		t.Fatalf("oldest age = %v, want > 0", got)
	}

	rec := &recorder{batchErrors: true}
	rec.setFail(func(msg *message.Message) error {
		if msg.UUID == poison[0] {
			return core.Permanent(errors.New("rejected"))
		}
		return nil
	})
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, Metrics: m, MaxAttempts: 1, PollInterval: 10 * time.Millisecond})
	eventually(t, 10*time.Second, "30 published, 1 dead", func() bool {
		return gauge("millrace_outbox_published_total") == 30 && gauge("millrace_outbox_dead_letters") == 1
	})
	if got := gauge("millrace_outbox_pending"); got != 0 {
		t.Fatalf("pending after drain = %v, want 0", got)
	}
	// Each of the 31 events was sent once (the poison failed for good on
	// its first attempt), in at least one batch.
	sizes := histogram(t, reg, "millrace_outbox_batch_size")
	if sizes.GetSampleSum() != 31 || sizes.GetSampleCount() < 1 || sizes.GetSampleCount() > 31 {
		t.Fatalf("batch_size histogram %v, want 31 events over 1 to 31 batches", sizes)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP millrace_outbox_dead_lettered_total Outbox events moved to the dead-letter state.
# TYPE millrace_outbox_dead_lettered_total counter
millrace_outbox_dead_lettered_total{service="test"} 1
`), "millrace_outbox_dead_lettered_total"); err != nil {
		t.Fatal(err)
	}
}

// histogram is the histogram name in reg (one series), or fails the test.
func histogram(t *testing.T, reg prometheus.Gatherer, name string) *dto.Histogram {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("no histogram %s", name)
	return nil
}
