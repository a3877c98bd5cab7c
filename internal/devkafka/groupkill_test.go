package devkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/kafkatest"
)

// The consumer settings of the group-kill test: millrace's subscriber
// settings with a short session timeout, so that a dead member is due for
// eviction within seconds, and the heartbeat at a third of it, as Kafka
// advises.
const (
	killSessionTimeout = 6 * time.Second
	killHeartbeat      = 2 * time.Second
	killPartitions     = 6
	killRounds         = 20
)

// The environment of TestHelperJoinGroupChild.
const (
	childBrokersEnv = "MILLRACE_GROUPKILL_BROKERS"
	childTopicEnv   = "MILLRACE_GROUPKILL_TOPIC"
	childGroupEnv   = "MILLRACE_GROUPKILL_GROUP"
	childDelayEnv   = "MILLRACE_GROUPKILL_DELAY"
)

func killSubscriberConfig() *sarama.Config {
	c := kafkatest.SaramaSubscriberConfig()
	c.Consumer.Group.Session.Timeout = killSessionTimeout
	c.Consumer.Group.Heartbeat.Interval = killHeartbeat
	return c
}

func newKillSubscriber(t testing.TB, brokers []string, group string) *wkafka.Subscriber {
	t.Helper()
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: killSubscriberConfig(),
		ConsumerGroup:         group,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return sub
}

// TestHelperJoinGroupChild is the consumer that
// TestConsumerKilledWhileJoiningLosesItsPartitions kills: it joins the group
// and, the delay it is given after its start, says it is ready to be
// killed. It reads nothing, so the partitions it is given stay unconsumed
// until the group takes them from it.
func TestHelperJoinGroupChild(t *testing.T) {
	brokers := os.Getenv(childBrokersEnv)
	if brokers == "" {
		t.Skip("helper process for TestConsumerKilledWhileJoiningLosesItsPartitions")
	}
	delay, err := time.ParseDuration(os.Getenv(childDelayEnv))
	if err != nil {
		t.Fatal(err)
	}
	kill := time.NewTimer(delay) // started first: the delay counts from the start
	sub := newKillSubscriber(t, strings.Split(brokers, ","), os.Getenv(childGroupEnv))
	if _, err := sub.Subscribe(context.Background(), os.Getenv(childTopicEnv)); err != nil {
		t.Fatal(err)
	}
	<-kill.C // the moment of the kill, not a wait for something
	childtest.Announce()
	select {} // killed here
}

// A consumer killed with SIGKILL 2-5 s after its start, while it joins its
// group, 20 times, must lose its partitions to the survivors within the
// session timeout: every record on every partition ends up consumed by the
// consumer that stays. Apache Kafka evicts such a member when its session
// times out; the embedded broker must too (kfake alone kept a member whose
// join reply went to a closed connection forever, and its partitions with
// it).
//
// The bound, from the last kill: the session timeout for the dead member
// to be evicted, two heartbeats for the survivor to notice the rebalance
// and rejoin, and 5 s for the rebalance and the fetch.
func TestConsumerKilledWhileJoiningLosesItsPartitions(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic, group := kafkatest.Topic(), kafkatest.Group()
	admin, err := sarama.NewClusterAdmin(brokers, kafkatest.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: killPartitions, ReplicationFactor: -1}, false)
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}

	pcfg := kafkatest.SaramaConfig()
	pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	producer, err := sarama.NewSyncProducer(brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	var (
		mu       sync.Mutex
		sent     = map[string]int32{} // record id -> partition
		consumed = map[string]bool{}
		seq      int
	)
	// produceRound writes one record to every partition.
	produceRound := func() {
		t.Helper()
		var msgs []*sarama.ProducerMessage
		mu.Lock()
		for p := range int32(killPartitions) {
			seq++
			id := fmt.Sprintf("p%d-%d", p, seq)
			sent[id] = p
			msgs = append(msgs, &sarama.ProducerMessage{
				Topic: topic, Partition: p, Value: sarama.StringEncoder(id),
				Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(id)}},
			})
		}
		mu.Unlock()
		if err := producer.SendMessages(msgs); err != nil {
			t.Error(err)
		}
	}
	// unconsumed returns how many records sent are not consumed yet, and on
	// how many partitions.
	unconsumed := func() (records int, partitions map[int32]int) {
		mu.Lock()
		defer mu.Unlock()
		partitions = map[int32]int{}
		for id, p := range sent {
			if !consumed[id] {
				records++
				partitions[p]++
			}
		}
		return records, partitions
	}
	waitConsumed := func(d time.Duration) bool {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if n, _ := unconsumed(); n == 0 {
				return true
			}
			time.Sleep(50 * time.Millisecond)
		}
		n, _ := unconsumed()
		return n == 0
	}

	survivor := newKillSubscriber(t, brokers, group)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := survivor.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range ch {
			mu.Lock()
			consumed[m.UUID] = true
			mu.Unlock()
			m.Ack()
		}
	}()
	defer func() {
		cancel()
		if err := survivor.Close(); err != nil {
			t.Error(err)
		}
		<-done
	}()
	produceRound()
	if !waitConsumed(60 * time.Second) {
		t.Fatal("the survivor did not consume the first records within 60s")
	}

	// Records go on arriving on every partition while the children join
	// and die.
	stopProducing := make(chan struct{})
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopProducing:
				return
			case <-tick.C:
				produceRound()
			}
		}
	}()
	env := []string{
		childBrokersEnv + "=" + strings.Join(brokers, ","),
		childTopicEnv + "=" + topic,
		childGroupEnv + "=" + group,
	}
	for range killRounds {
		delay := 2*time.Second + rand.N(3*time.Second)
		childtest.KillAtReady(t, "TestHelperJoinGroupChild", append(env, childDelayEnv+"="+delay.String()), 30*time.Second)
	}
	lastKill := time.Now()
	close(stopProducing)
	<-produced
	produceRound() // after the last kill, on every partition

	bound := killSessionTimeout + 2*killHeartbeat + 5*time.Second
	ok := waitConsumed(bound)
	took := time.Since(lastKill)
	n, parts := unconsumed()
	mu.Lock()
	total := len(sent)
	mu.Unlock()
	if !ok {
		// Still waiting shows whether they were only late or stuck.
		waitConsumed(30 * time.Second)
		later, _ := unconsumed()
		t.Fatalf("%d kills: %d of %d records on partitions %v unconsumed %s after the last kill (bound %s: session timeout %s + 2 heartbeats + 5s); %d still unconsumed 30s later",
			killRounds, n, total, parts, took.Round(time.Millisecond), bound, killSessionTimeout, later)
	}
	t.Logf("%d kills: all %d records consumed %s after the last kill (bound %s)", killRounds, total, took.Round(time.Millisecond), bound)
}
