package devkafka_test

import (
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// produce sends n records to topic through a plain sarama SyncProducer with
// millrace's producer settings, in watermill-kafka's format (UUID header,
// key), and returns their UUIDs in order.
func produce(t *testing.T, addrs []string, topic string, n int) []string {
	t.Helper()
	p, err := sarama.NewSyncProducer(addrs, kafkatest.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var uuids []string
	for i := range n {
		uuid := "uuid-" + strconv.Itoa(i)
		_, _, err := p.SendMessage(&sarama.ProducerMessage{
			Topic:   topic,
			Key:     sarama.StringEncoder("key-" + strconv.Itoa(i%3)),
			Value:   sarama.StringEncoder("payload-" + strconv.Itoa(i)),
			Headers: []sarama.RecordHeader{{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(uuid)}},
		})
		if err != nil {
			t.Fatal(err)
		}
		uuids = append(uuids, uuid)
	}
	return uuids
}

// consume reads n messages from topic with kafkatest.Read (a fresh
// consumer group) and checks each against what produce sent.
func consume(t *testing.T, addrs []string, topic string, n int) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	for _, m := range kafkatest.Read(t, addrs, topic, n) {
		i, err := strconv.Atoi(m.UUID[len("uuid-"):])
		if err != nil {
			t.Fatalf("unexpected message %q", m.UUID)
		}
		key, _ := wkafka.MessageKeyFromCtx(m.Context())
		if string(m.Payload) != "payload-"+strconv.Itoa(i) || string(key) != "key-"+strconv.Itoa(i%3) {
			t.Fatalf("message %s: payload %q key %q", m.UUID, m.Payload, key)
		}
		if got[m.UUID] {
			t.Fatalf("message %s consumed twice", m.UUID)
		}
		got[m.UUID] = true
	}
	return got
}

func TestProduceAndConsumeOverTCP(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{Partitions: 3})
	if b.Port() == 0 {
		t.Fatalf("no port in %v", b.Addrs())
	}
	topic := kafkatest.Topic()
	uuids := produce(t, b.Addrs(), topic, 30)
	got := consume(t, b.Addrs(), topic, len(uuids))
	for _, u := range uuids {
		if !got[u] {
			t.Fatalf("message %s not consumed", u)
		}
	}
	if n := kafkatest.RecordCount(t, b.Addrs(), topic); n != 30 {
		t.Fatalf("topic holds %d records, want 30", n)
	}
}

func TestRestartWithDataDirKeepsRecords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b := kafkatest.Embedded(t, devkafka.Config{DataDir: dir})
	port := b.Port()
	topic := kafkatest.Topic()
	uuids := produce(t, b.Addrs(), topic, 20)
	b.Close()

	b2 := kafkatest.Embedded(t, devkafka.Config{Port: port, DataDir: dir})
	if b2.Port() != port {
		t.Fatalf("restarted on port %d, want %d", b2.Port(), port)
	}
	if n := kafkatest.RecordCount(t, b2.Addrs(), topic); n != int64(len(uuids)) {
		t.Fatalf("after the restart the topic holds %d records, want %d", n, len(uuids))
	}
	got := consume(t, b2.Addrs(), topic, len(uuids))
	for _, u := range uuids {
		if !got[u] {
			t.Fatalf("message %s lost across the restart", u)
		}
	}
}

func TestRestartWithoutDataDirForgets(t *testing.T) {
	t.Parallel()
	b := kafkatest.Embedded(t, devkafka.Config{})
	port := b.Port()
	topic := kafkatest.Topic()
	produce(t, b.Addrs(), topic, 1)
	b.Close()

	// Without a DataDir the restarted broker starts empty: the test above
	// would pass for the wrong reason if it did not.
	b2 := kafkatest.Embedded(t, devkafka.Config{Port: port})
	if n := kafkatest.RecordCount(t, b2.Addrs(), topic); n != 0 {
		t.Fatalf("a broker without DataDir kept %d records", n)
	}
}

func TestEnvBrokers(t *testing.T) {
	t.Setenv("KAFKA_BROKERS", " a:1, ,b:2 ")
	got := devkafka.EnvBrokers()
	if len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Fatalf("EnvBrokers() = %q", got)
	}
	t.Setenv("KAFKA_BROKERS", "")
	if got := devkafka.EnvBrokers(); got != nil {
		t.Fatalf("EnvBrokers() with KAFKA_BROKERS empty = %q", got)
	}
}
