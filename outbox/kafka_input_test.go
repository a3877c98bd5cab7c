package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// Through the Kafka protocol, a consumer reads each payload byte for byte
// as it was written and each metadata value as given.
func TestKafkaDeliversPayloadByteForByte(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokers := kafkatest.Brokers(t)
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, ValidateTopic: kafka.ValidateTopic})
	if err != nil {
		t.Fatal(err)
	}
	topic := kafkatest.Topic()
	md := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "note": "žluťoučký 🐎 <&>"}
	events := []outbox.Event{
		{Topic: topic, PartitionKey: "k", Payload: []byte(`{"b":1,"a":2,"a":3,"n":1.50e2}`), Metadata: md},
		{Topic: topic, PartitionKey: "k", Payload: []byte("{ \"s\": \"\\u0000\" ,\n \"e\":\"\\u00e9\" }"), Metadata: md},
		{Topic: topic, PartitionKey: "k", Payload: []byte{0, 0xff, 'x'}, Binary: true, Metadata: md},
	}
	ids, err := w.Write(ctx, events...)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	startRelay(t, db, outbox.RelayConfig{Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: watermill.NopLogger{}})
	got := kafkatest.Read(t, brokers, topic, len(events))
	for i, m := range got { // one key: in write order
		if m.UUID != ids[i] || string(m.Payload) != string(events[i].Payload) {
			t.Fatalf("message %d: %s %q, written %s %q", i, m.UUID, m.Payload, ids[i], events[i].Payload)
		}
		for k, v := range md {
			if m.Metadata.Get(k) != v {
				t.Fatalf("message %d: metadata %q = %q, written %q", i, k, m.Metadata.Get(k), v)
			}
		}
	}
	if ct := got[2].Metadata.Get(core.MetadataContentType); ct != core.ContentTypeBinary {
		t.Fatalf("binary payload arrived with content type %q", ct)
	}
}
