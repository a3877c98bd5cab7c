package outbox_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// Example_relay writes an event in a business transaction, lets a relay
// ship it to Kafka, and reads it back with watermill-kafka's subscriber.
func Example_relay() {
	ctx := context.Background()
	db, closeDB, err := pgtest.Open(ctx, 4) // a pool and a freshly migrated schema
	if err != nil {
		log.Fatal(err)
	}
	defer closeDB()
	pool, schema := db.Pool, db.Schema
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		b, err := devbroker.Start(devbroker.Config{})
		if err != nil {
			log.Fatal(err)
		}
		defer b.Close()
		brokers = b.Addrs()
	}
	topic := pgtest.RandomName("orders")

	// The business transaction: the order and its event commit together.
	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{Schema: schema})
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := w.WriteTx(ctx, tx, outbox.Event{
		ID:           "0190b7e2-5f00-7000-8000-00000000002a",
		Topic:        topic,
		PartitionKey: "customer-7",
		EventType:    "OrderPlaced",
		Payload:      []byte(`{"order_id": 42, "amount": 1999}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// The relay ships it.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: pub})
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()
	defer func() { stop(); <-done }() // a graceful stop finishes the batch in flight

	// Any watermill-kafka consumer reads it.
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           kafka.DefaultMarshaler(),
		OverwriteSaramaConfig: kafka.DefaultSaramaSubscriberConfig(),
		ConsumerGroup:         pgtest.RandomName("billing"),
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		log.Fatal(err)
	}
	select {
	case msg := <-msgs:
		msg.Ack()
		key, _ := wkafka.MessageKeyFromCtx(msg.Context())
		fmt.Println("event id:", msg.UUID)
		fmt.Println("type:", msg.Metadata.Get(millrace.MetadataEventType), "key:", string(key))
		fmt.Println("payload:", string(msg.Payload))
	case <-time.After(30 * time.Second):
		fmt.Println("timed out")
	}
	// Output:
	// event id: 0190b7e2-5f00-7000-8000-00000000002a
	// type: OrderPlaced key: customer-7
	// payload: {"order_id": 42, "amount": 1999}
}
