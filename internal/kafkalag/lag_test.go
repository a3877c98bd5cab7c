package kafkalag_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkalag"
	"github.com/millrace/millrace/internal/kafkatest"
)

// Two groups on a two-partition topic of ten records a partition, written
// two hours ago and a minute apart: "dead" committed 5 on partition 0 and
// everything on partition 1, and has no member (its service crashed);
// "live" has a member holding both partitions and never committed. The
// reader reports each group's lag per partition, who holds it, the age of
// the oldest waiting record and which partitions are stalled.
func TestLagReaderReportsLagAgeAndStalledPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	topic, dead, live := kafkatest.Topic(), kafkatest.Group(), kafkatest.Group()
	kafkatest.CreateTopic(t, brokers, topic, 2, nil)

	written := time.Now().Add(-2 * time.Hour).Truncate(time.Millisecond)
	var stamps []time.Time
	for i := range 10 {
		stamps = append(stamps, written.Add(time.Duration(i)*time.Minute))
	}
	kafkatest.ProduceAt(t, brokers, topic, 0, stamps...)
	kafkatest.ProduceAt(t, brokers, topic, 1, stamps...)
	kafkatest.CommitOffset(t, brokers, dead, topic, 0, 5)
	kafkatest.CommitOffset(t, brokers, dead, topic, 1, 10)
	member, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(live), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ClientID("payments-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	// The member has joined once it fetched something.
	for got := 0; got == 0; {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		fs := member.PollFetches(pctx)
		timedOut := pctx.Err() != nil
		cancel()
		if timedOut {
			t.Fatal("the live member fetched nothing in 30s")
		}
		got = fs.NumRecords()
	}

	r, err := kafkalag.New(kafkalag.Config{Brokers: brokers, Groups: []string{dead, live}, StallAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var lags []kafkalag.Partition
	// The member's assignment shows in the group's description once the
	// join completed everywhere: read until it does.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if lags, err = r.Read(ctx); err != nil {
			t.Fatal(err)
		}
		if len(lags) == 4 && lags[0].Group == min(dead, live) && assigned(lags, live) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lags = %+v", lags)
		}
		time.Sleep(100 * time.Millisecond)
	}
	byKey := map[string]kafkalag.Partition{}
	for _, l := range lags {
		if l.Topic != topic || l.Err != "" {
			t.Fatalf("unexpected line %+v", l)
		}
		byKey[l.Group+"/"+string(rune('0'+l.Partition))] = l
	}
	age := func(l kafkalag.Partition, wantWritten time.Time) {
		t.Helper()
		want := time.Since(wantWritten)
		if d := l.OldestAge - want; d < -time.Minute || d > time.Minute {
			t.Errorf("%s/%d: oldest age %s, want about %s", l.Group, l.Partition, l.OldestAge, want)
		}
	}
	d0, d1 := byKey[dead+"/0"], byKey[dead+"/1"]
	if d0.Committed != 5 || d0.End != 10 || d0.Lag != 5 || d0.Member != "" || !d0.Stalled {
		t.Errorf("dead group, partition 0: %+v; want committed 5, end 10, lag 5, no member, stalled", d0)
	}
	age(d0, written.Add(5*time.Minute))
	if d1.Lag != 0 || d1.OldestAge != 0 || d1.Stalled {
		t.Errorf("dead group, partition 1: %+v; want no lag, not stalled", d1)
	}
	for p := range 2 {
		l := byKey[live+"/"+string(rune('0'+p))]
		if l.Lag != 10 || !strings.HasPrefix(l.Member, "payments-1@") || !l.Stalled {
			t.Errorf("live group, partition %d: %+v; want lag 10 from the start, held by payments-1, stalled", p, l)
		}
		age(l, written)
	}

	// The same figures as gauges.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.Collector())
	if n, err := testutil.GatherAndCount(reg, "millrace_kafka_consumer_lag", "millrace_kafka_consumer_stalled"); err != nil || n != 8 {
		t.Fatalf("gathered %d series, %v; want 8", n, err)
	}
	want := `
# HELP millrace_kafka_consumer_stalled 1 when records of the partition wait longer than StallAfter: nobody consumes them.
# TYPE millrace_kafka_consumer_stalled gauge
millrace_kafka_consumer_stalled{group="` + dead + `",partition="0",topic="` + topic + `"} 1
millrace_kafka_consumer_stalled{group="` + dead + `",partition="1",topic="` + topic + `"} 0
millrace_kafka_consumer_stalled{group="` + live + `",partition="0",topic="` + topic + `"} 1
millrace_kafka_consumer_stalled{group="` + live + `",partition="1",topic="` + topic + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "millrace_kafka_consumer_stalled"); err != nil {
		t.Fatal(err)
	}
}

func assigned(lags []kafkalag.Partition, group string) bool {
	for _, l := range lags {
		if l.Group == group && l.Member == "" {
			return false
		}
	}
	return true
}

func TestLagReaderConfig(t *testing.T) {
	t.Parallel()
	if _, err := kafkalag.New(kafkalag.Config{}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no brokers: %v, want ErrConfig", err)
	}
	if _, err := kafkalag.New(kafkalag.Config{Brokers: []string{"127.0.0.1:1"}, StallAfter: -1}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("negative StallAfter: %v, want ErrConfig", err)
	}
}
