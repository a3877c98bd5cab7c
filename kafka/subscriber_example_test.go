package kafka_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/kafka"
)

// Publish a batch, then read it back with Subscriber's batch interface:
// the records of a partition come many at a time and are acked as one.
func Example_subscribeBatch() {
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
		msgs = append(msgs, m)
	}
	if err := pub.Publish("orders", msgs...); err != nil {
		log.Fatal(err)
	}

	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:       broker.Addrs(),
		ConsumerGroup: "billing",
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	batches, err := sub.SubscribeBatch(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	for read := 0; read < len(msgs); {
		b := <-batches
		for _, m := range b.Messages {
			r, _ := kafka.RecordFromContext(m.Context())
			fmt.Printf("%s key=%s %s\n", m.UUID, r.Key, m.Payload)
		}
		read += len(b.Messages)
		b.Ack() // the offset after the batch is committed
	}
	// Output:
	// 0190c2a4-0000-7000-8000-000000000000 key=order-42 {"item":"tea"}
	// 0190c2a4-0000-7000-8000-000000000001 key=order-42 {"item":"milk"}
	// 0190c2a4-0000-7000-8000-000000000002 key=order-42 {"item":"bread"}
}
