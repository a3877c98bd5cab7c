package compensation_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// With kafka.Subscriber, RunBatched takes whole fetches: hundreds of
// commands waiting on the topic are handled in a few transactions, each
// once (duplicates within and across fetches are caught by the dedup
// marks), a malformed one poisoned. A command that fails in a big batch
// makes it fall back to one command per transaction: the failing one is
// nacked (with what follows it in its partition) and comes again.
func TestRunBatchedTakesWholeFetches(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	r := newRunRig(t, b, 4)
	const sagas = 300
	ids := make([]string, sagas)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	flaky := ids[77]
	var flakyCalls atomic.Int32
	b.setFailAction(func(call compensation.Call) error {
		if call.SagaID == flaky && flakyCalls.Add(1) <= 2 {
			return errTechnical
		}
		return nil
	})
	var msgs []*message.Message
	for i, id := range ids {
		m := action(id, 1)
		m.Metadata.Set(core.MetadataPartitionKey, id)
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m) // again, right behind it
		}
	}
	msgs = append(msgs, msgs[:20]...) // and again, later
	bad := action(uuid.NewString(), 1)
	bad.Metadata.Set(core.MetadataSagaAttempt, "x")
	msgs = append(msgs, bad)
	if err := r.pub.Publish(r.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	r.run(t)
	r.expectPoisoned(t, bad)
	r.waitHandled(t, sagas)
	barrier := b.db.Schema + ".compensation_barrier"
	for _, id := range ids {
		if n := b.effects(t, id, "reserve"); n != 1 {
			t.Fatalf("saga %s: %d effects, want 1", id, n)
		}
		if rs := b.replies(t, id); len(rs) != 1 {
			t.Fatalf("saga %s: %d replies, want 1 (the duplicates deduplicated)", id, len(rs))
		}
	}
	if flakyCalls.Load() < 3 {
		t.Fatalf("flaky's action ran %d times", flakyCalls.Load())
	}
	// Rows written by one transaction share its xmin: the batches', and
	// one each for the commands of the failed batch (at most the largest).
	txs := b.count(t, `SELECT count(DISTINCT xmin::text) FROM `+barrier)
	batches, _, largest := batchSizes(t, b.metrics)
	if batches > 20 || uint64(txs) > batches+largest {
		t.Fatalf("%d transactions (%d batches, the largest at most %d) wrote %d barrier rows", txs, batches, largest, sagas)
	}
	t.Logf("%d commands: %d batches, the largest at most %d; %d transactions wrote the barrier rows", len(msgs), batches, largest, txs)
}

// Commands that come one at a time take RunBatched's path for a batch of
// one (the mark in BEGIN's round trip): each applied once, a redelivery
// deduplicated, one without a usable event id poisoned.
func TestRunBatchedOneCommandAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	r := newRunRig(t, b, 1)
	r.run(t)
	batches := func() uint64 { n, _, _ := batchSizes(t, b.metrics); return n }
	publish := func(m *message.Message) {
		t.Helper()
		if err := r.pub.Publish(r.topic, m); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{uuid.NewString(), uuid.NewString(), uuid.NewString()}
	var sent []*message.Message
	for i, id := range ids {
		m := action(id, 1)
		sent = append(sent, m)
		publish(m)
		r.waitHandled(t, i+1)
	}
	// The first again, alone: a duplicate; then one the inbox cannot
	// mark, poisoned; then a new one, to see the duplicate went by. The
	// duplicate changes nothing to wait for but its batch: published
	// behind it at once, the next one was fetched with it in a CI run.
	publish(sent[0])
	for deadline := time.Now().Add(60 * time.Second); batches() < uint64(len(sent))+1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the redelivery was not taken: %d batches", batches())
		}
	}
	bad := action(uuid.NewString(), 1)
	bad.UUID = "not-a-uuid"
	publish(bad)
	r.expectPoisoned(t, bad)
	last := action(uuid.NewString(), 1)
	ids = append(ids, last.Metadata.Get(core.MetadataSagaID))
	publish(last)
	r.waitHandled(t, len(ids))
	for _, id := range ids {
		if n := b.effects(t, id, "reserve"); n != 1 {
			t.Fatalf("saga %s: %d effects, want 1", id, n)
		}
		if rs := b.replies(t, id); len(rs) != 1 {
			t.Fatalf("saga %s: %d replies, want 1 (the redelivery deduplicated)", id, len(rs))
		}
	}
	if n, sum, _ := batchSizes(t, b.metrics); float64(n) != sum {
		t.Errorf("%d batches held %v commands; want one at a time", n, sum)
	}
}

// runRig is RunBatched of b's participant on a fresh topic, with a
// publisher to it and the poison topic's messages.
type runRig struct {
	b        *bundle
	topic    string
	pub      *kafka.Publisher
	sub      *kafka.Subscriber
	poison   *gochannel.GoChannel
	poisoned <-chan *message.Message
	ctx      context.Context
}

func newRunRig(t *testing.T, b *bundle, partitions int32) *runRig {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	r := &runRig{b: b, topic: kafkatest.Topic()}
	kafkatest.CreateTopic(t, brokers, r.topic, partitions, nil)
	var err error
	if r.pub, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.pub.Close() })
	if r.sub, err = kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: brokers, ConsumerGroup: kafkatest.Group()}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.sub.Close() })
	r.poison = gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = r.poison.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx = ctx
	t.Cleanup(cancel)
	if r.poisoned, err = r.poison.Subscribe(ctx, r.topic+".poison"); err != nil {
		t.Fatal(err)
	}
	return r
}

// run starts RunBatched, stopped (and its error checked) when the test
// ends.
func (r *runRig) run(t *testing.T) {
	runBatched(t, r.b.p, compensation.RunConfig{Subscriber: r.sub, Topic: r.topic, Poison: r.poison})
}

// expectPoisoned waits for the poison topic's next message: want.
func (r *runRig) expectPoisoned(t *testing.T, want *message.Message) {
	t.Helper()
	select {
	case m := <-r.poisoned:
		if m.UUID != want.UUID {
			t.Fatalf("poisoned %s", m.UUID)
		}
		m.Ack()
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was not poisoned", want.UUID)
	}
}

// waitHandled waits until n commands have their barrier answered.
func (r *runRig) waitHandled(t *testing.T, n int) {
	t.Helper()
	barrier := r.b.db.Schema + ".compensation_barrier"
	for deadline := time.Now().Add(60 * time.Second); ; {
		if got := r.b.count(t, `SELECT count(*) FROM `+barrier+` WHERE outcome IS NOT NULL`); got == n {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("%d of %d commands handled", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A command alone costs one round trip for BEGIN, its dedup mark, its
// barrier claim and the savepoint, its function's own (two here), and one
// for the answer, the reply and the COMMIT; a redelivery costs the round
// trip its mark fails in and the rollback, and changes nothing.
func TestRunBatchedOneCommandRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t, 4)
	p, _, trips := b.tracedParticipant(t, 2)
	b.p = p
	r := newRunRig(t, b, 1)
	r.run(t)
	batches := func() uint64 { n, _, _ := batchSizes(t, b.metrics); return n }
	publish := func(m *message.Message) {
		t.Helper()
		if err := r.pub.Publish(r.topic, m); err != nil {
			t.Fatal(err)
		}
	}
	first := action(uuid.NewString(), 1)
	start := trips.N()
	publish(first)
	r.waitHandled(t, 1)
	if got := trips.N() - start; got != 4 {
		t.Errorf("a command alone took %d round trips; want 4 (claim with mark, the function's two, reply with commit)", got)
	}
	second := action(uuid.NewString(), 1)
	start = trips.N()
	publish(first) // again: a duplicate
	// The new command goes out once the duplicate's batch has formed: in
	// one batch with it, the pair would cost a batch's fallback instead.
	for deadline := time.Now().Add(60 * time.Second); batches() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the duplicate was not taken in a batch")
		}
	}
	publish(second)
	r.waitHandled(t, 2)
	if got := trips.N() - start; got != 2+4 {
		t.Errorf("a redelivery and a new command took %d round trips; want 6", got)
	}
	for _, m := range []*message.Message{first, second} {
		id := m.Metadata.Get(core.MetadataSagaID)
		if n := b.effects(t, id, "reserve"); n != 1 {
			t.Errorf("saga %s: %d effects, want 1", id, n)
		}
		if rs := b.replies(t, id); len(rs) != 1 {
			t.Errorf("saga %s: %d replies, want 1", id, len(rs))
		}
	}
}

// batchSizes reads the batch_size histogram of m: the number of batches,
// the commands they held, and the upper bound of the bucket of the largest.
func batchSizes(t *testing.T, reg *prometheus.Registry) (batches uint64, commands float64, largest uint64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "millrace_compensation_batch_size" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			h := mt.GetHistogram()
			batches, commands = batches+h.GetSampleCount(), commands+h.GetSampleSum()
			for _, b := range h.GetBucket() {
				if b.GetCumulativeCount() == h.GetSampleCount() {
					largest = max(largest, uint64(b.GetUpperBound()))
					break
				}
			}
		}
	}
	return batches, commands, largest
}
