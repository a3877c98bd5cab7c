package kafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/kafka"
)

// Publish three messages as one batch to an embedded broker and read them
// back with watermill-kafka's Subscriber in a consumer group.
func Example_publishAndReadBack() {
	broker, err := devbroker.Start(devbroker.Config{Partitions: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer broker.Close()

	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: broker.Addrs()}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	var msgs []*message.Message
	for i, item := range []string{"tea", "milk", "bread"} {
		m := message.NewMessage(fmt.Sprintf("0190c2a4-0000-7000-8000-00000000000%d", i), []byte(`{"item":"`+item+`"}`))
		m.Metadata.Set(core.MetadataPartitionKey, "order-42")
		m.Metadata.Set(core.MetadataEventType, "ItemAdded")
		msgs = append(msgs, m)
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		log.Fatal(err)
	}

	// sarama's consumer groups need a protocol version the brokers speak;
	// a new group starts at the oldest record.
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               broker.Addrs(),
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         "example",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch, err := sub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	for range msgs {
		m := <-ch
		key, _ := wkafka.MessageKeyFromCtx(m.Context())
		fmt.Printf("%s key=%s %s %s\n", m.UUID, key, m.Metadata.Get(core.MetadataEventType), m.Payload)
		m.Ack()
	}
	// Output:
	// 0190c2a4-0000-7000-8000-000000000000 key=order-42 ItemAdded {"item":"tea"}
	// 0190c2a4-0000-7000-8000-000000000001 key=order-42 ItemAdded {"item":"milk"}
	// 0190c2a4-0000-7000-8000-000000000002 key=order-42 ItemAdded {"item":"bread"}
}

// byCustomerID keys records by the metadata "customer_id" instead of the
// partition key, in DefaultMarshaler's format otherwise. When the default
// refuses a message it returns the record with the key it would have had;
// the Publisher then holds back only that key's later messages.
type byCustomerID struct{}

func (byCustomerID) Marshal(topic string, msg *message.Message) (*kgo.Record, error) {
	r, err := kafka.DefaultMarshaler().Marshal(topic, msg)
	if r != nil {
		r.Key = []byte(msg.Metadata.Get("customer_id"))
	}
	return r, err
}

// A Publisher whose records are keyed by another field than the partition
// key: a customer's messages keep their order, whatever their partition
// key.
func ExampleMarshaler() {
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:   []string{"127.0.0.1:9092"},
		Marshaler: byCustomerID{},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
}
