package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/devbroker"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
)

// Example_relay writes an event in a business transaction, lets a relay
// ship it to Kafka, and reads it back with watermill-kafka's subscriber.
func Example_relay() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// A schema of its own, dropped at the end.
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx) // millrace's tables
	}
	if err != nil {
		log.Fatal(err)
	}
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		b, err := devbroker.Start(devbroker.Config{})
		if err != nil {
			log.Fatal(err)
		}
		defer b.Close()
		brokers = b.Addrs()
	}
	topic := fmt.Sprintf("orders-%08x", rand.Uint32())

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

	// Any watermill-kafka consumer reads it (sarama's consumer groups need
	// a protocol version the brokers speak; a new group starts at the
	// oldest record).
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         "billing-" + topic,
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
		fmt.Println("type:", msg.Metadata.Get(core.MetadataEventType), "key:", string(key))
		fmt.Println("payload:", string(msg.Payload))
	case <-time.After(30 * time.Second):
		fmt.Println("timed out")
	}
	// Output:
	// event id: 0190b7e2-5f00-7000-8000-00000000002a
	// type: OrderPlaced key: customer-7
	// payload: {"order_id": 42, "amount": 1999}
}

// failingPublisher refuses every message, as a broker would refuse a
// message that breaks its limits.
type failingPublisher struct{}

func (failingPublisher) Publish(string, ...*message.Message) error {
	return core.Permanent(errors.New("message too large"))
}
func (failingPublisher) Close() error { return nil }

// Example_deadLetters shows an operator finding a dead letter, reading why
// it failed, and requeueing it once the cause is fixed.
func Example_deadLetters() {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// A schema of its own, dropped at the end.
	schema := fmt.Sprintf("example_%08x", rand.Uint32())
	defer pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") //nolint:errcheck
	m, err := migrations.New(pool, migrations.Config{Schema: schema})
	if err == nil {
		_, err = m.Up(ctx) // millrace's tables
	}
	if err != nil {
		log.Fatal(err)
	}

	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{Schema: schema})
	if _, err := w.Write(ctx, outbox.Event{
		ID: "0190b7e2-5f00-7000-8000-000000000001", Topic: "orders", PartitionKey: "order-1",
		EventType: "OrderCreated", Payload: []byte(`{"id":"order-1"}`),
	}); err != nil {
		log.Fatal(err)
	}

	// A relay whose publisher refuses the event dead-letters it after
	// MaxAttempts tries.
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Schema: schema, Publisher: failingPublisher{}, MaxAttempts: 1, PollInterval: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	admin, err := outbox.NewAdmin(pool, outbox.AdminConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(rctx) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		s, err := admin.Stats(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if s.Dead == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		log.Fatal(err)
	}

	dead, err := admin.List(ctx, core.ListParams{Topic: "orders"})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dead {
		fmt.Printf("%s %s after %d attempt(s): %s\n", d.EventType, d.EventID, d.Attempts, d.LastError)
	}

	// The cause is fixed: publish it again (or Discard it to let the
	// events behind it flow). Who and why go to the audit trail.
	n, err := admin.Requeue(ctx, core.Actor{Operator: "ada", Reason: "topic created"}, dead[0].EventID)
	if err != nil {
		log.Fatal(err)
	}
	s, _ := admin.Stats(ctx)
	fmt.Printf("requeued %d; pending %d, dead %d\n", n, s.Pending, s.Dead)
	// Output:
	// OrderCreated 0190b7e2-5f00-7000-8000-000000000001 after 1 attempt(s): message too large
	// requeued 1; pending 1, dead 0
}
