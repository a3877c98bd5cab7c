package kafka_test

import (
	"errors"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/kafka"
)

// A message that carries a partition key is keyed by it: a Marshaler that
// keys it by another field has it refused, permanently, and nothing of it
// is stored; messages that carry none are keyed as the Marshaler says.
// The outbox orders, and holds a failed event's key back, by partition
// key, so a record keyed by another field would be ordered only within
// one call: a failed event of record key C would let a later event of C
// with another partition key be stored past it in the next call.
func TestPublishRefusesARecordNotKeyedByItsPartitionKey(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.Topic()
	p := newPublisherWith(t, kafka.PublisherConfig{Brokers: brokers, Marshaler: byCustomer{}})
	withKey := newMessage(1, "order-1")
	withKey.Metadata.Set("customer", "alice")
	keyless := newMessage(2, "order-2")
	delete(keyless.Metadata, core.MetadataPartitionKey)
	keyless.Metadata.Set("customer", "bob")
	sameKey := newMessage(3, "carol")
	sameKey.Metadata.Set("customer", "carol")
	failed := failures(t, p.Publish(topic, withKey, keyless, sameKey))
	if err := failed[withKey.UUID]; !errors.Is(err, kafka.ErrMarshal) || !core.IsPermanent(err) {
		t.Fatalf("a message keyed by another field than its partition key: %v, want a permanent ErrMarshal", err)
	}
	if len(failed) != 1 {
		t.Fatalf("%d messages failed, want 1: %v", len(failed), failed)
	}
	got := map[string]string{}
	for _, r := range readBack(t, brokers, topic, 2) {
		got[r.msg.UUID] = r.key
	}
	if got[keyless.UUID] != "bob" || got[sameKey.UUID] != "carol" || len(got) != 2 {
		t.Fatalf("stored %v; want %s keyed bob and %s keyed carol", got, keyless.UUID, sameKey.UUID)
	}
}
