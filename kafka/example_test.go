package kafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

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

	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               broker.Addrs(),
		Unmarshaler:           kafka.DefaultMarshaler(),
		OverwriteSaramaConfig: kafka.DefaultSaramaSubscriberConfig(),
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
