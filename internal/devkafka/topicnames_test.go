package devkafka_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/internal/devkafka"
)

// A topic name Kafka refuses (300 characters: longer than Kafka allows,
// and than a file name can be) is not created on first use, as Kafka
// creates none: a produce to it fails, and the broker, restarted on its
// data directory, starts and keeps its other topics. (It auto-created the
// topic, and then failed to start for good: "loading persisted state:
// ... file name too long".)
func TestBrokerRefusesATopicNameKafkaRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := devkafka.Start(devkafka.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	good := "good-topic"
	uuids := produce(t, b.Addrs(), good, 3)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.AllowAutoTopicCreation(), kgo.UnknownTopicRetries(1), kgo.RecordDeliveryTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = cl.ProduceSync(context.Background(), &kgo.Record{Topic: strings.Repeat("t", 300), Value: []byte("v")}).FirstErr()
	cl.Close()
	if err == nil {
		t.Fatal("a record for a 300-character topic was stored")
	}
	port := b.Port()
	b.Close()
	b, err = devkafka.Start(devkafka.Config{Port: port, DataDir: dir})
	if err != nil {
		t.Fatalf("restart on the data directory: %v", err)
	}
	defer b.Close()
	if got := consume(t, b.Addrs(), good, len(uuids)); len(got) != len(uuids) {
		t.Fatalf("%d of %d records of the good topic after the restart", len(got), len(uuids))
	}
}

// A data directory that already holds a topic whose name Kafka refuses
// (written by a broker before it refused such names): the broker starts
// and loads the rest, without that topic.
func TestBrokerLoadsTheRestPastABadTopicEntry(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	old, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := old.CreateTopic("good-topic", 1, nil); err != nil {
		t.Fatal(err)
	}
	_ = old.CreateTopic(strings.Repeat("t", 300), 1, nil)
	uuids := produce(t, old.ListenAddrs(), "good-topic", 3)
	old.Close()
	b, err := devkafka.Start(devkafka.Config{DataDir: dir})
	if err != nil {
		t.Fatalf("start on the data directory: %v", err)
	}
	defer b.Close()
	if got := consume(t, b.Addrs(), "good-topic", len(uuids)); len(got) != len(uuids) {
		t.Fatalf("%d of %d records of the good topic", len(got), len(uuids))
	}
}
