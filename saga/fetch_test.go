package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/saga"
)

// replyBatches returns the transactions RunBatched began and the replies
// they took, from the reply_batch_size histogram.
func replyBatches(t *testing.T, reg *prometheus.Registry) (txs uint64, replies float64) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "millrace_saga_reply_batch_size" {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// With kafka.Subscriber, RunBatched takes whole fetches: hundreds of
// replies waiting on the reply topic are applied in a few transactions,
// duplicates within and across fetches once. A reply that fails in a big
// batch makes it fall back to one reply per transaction: the failing one
// is nacked (with what follows it in its partition) and comes again; in
// the end every saga has moved on exactly once.
func TestRunBatchedTakesWholeFetches(t *testing.T) {
	t.Parallel()
	const n = 240
	brokers := kafkatest.Brokers(t)
	replyTopic := kafkatest.Topic()
	kafkatest.CreateTopic(t, brokers, replyTopic, 4, nil)
	var fails atomic.Int32
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		// The first batch holding f-77 fails, and so does f-77 alone once.
		if id == "f-77" && p == sagahook.Loaded && fails.Add(1) <= 2 {
			return errors.New("injected")
		}
		return nil
	}
	metrics := prometheus.NewPedanticRegistry()
	b := setup(t, bundleOptions{clock: newManualClock(), hook: hook, metrics: metrics})
	spec := orderSpec(b, 1)
	spec.ReplyTopic = replyTopic
	def := mustDefine(t, spec)
	if err := b.o.Register(def); err != nil {
		t.Fatal(err)
	}
	d := &driver{testBundle: b}
	var replies []*message.Message
	for i := range n {
		id := fmt.Sprintf("f-%d", i)
		start(t, b, def, id, 1)
		r := replyMsg(id, d.last(id), core.OutcomeSuccess, "", "")
		r.Metadata.Set(core.MetadataPartitionKey, id)
		replies = append(replies, r)
		if i%10 == 0 {
			replies = append(replies, r) // the same message again, right behind it
		}
	}
	replies = append(replies, replies[:20]...) // and again, later
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish(replyTopic, replies...); err != nil {
		t.Fatal(err)
	}
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Group()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- b.o.RunBatched(ctx, saga.BatchConfig{Subscriber: sub, Poison: b.pubsub, Workers: 2})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	for deadline := time.Now().Add(60 * time.Second); ; {
		var moved int
		if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+b.tbl("saga_instance")+
			` WHERE step = 'stock'`).Scan(&moved); err != nil {
			t.Fatal(err)
		}
		if moved == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sagas moved on", moved, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range n {
		id := fmt.Sprintf("f-%d", i)
		var stock int
		for _, c := range d.commands(id) {
			if c.Step == "stock" {
				stock++
			}
		}
		if stock != 1 {
			t.Fatalf("%s sent %d stock commands", id, stock)
		}
	}
	if fails.Load() < 3 {
		t.Fatalf("f-77 loaded %d times: the failure was not retried", fails.Load())
	}
	txs, took := replyBatches(t, metrics)
	// 284 replies, a few batches each try: the first fetches, the failed
	// batch's fallback (not counted: one per transaction) and the redelivery
	// from f-77 on in its partition.
	if txs > 30 || took < n {
		t.Fatalf("%d replies in %d batch transactions", int(took), txs)
	}
	t.Logf("%d replies in %d batch transactions", int(took), txs)
}
