package inbox_test

import (
	"context"
	"fmt"
	"log"
	"math/rand/v2"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
)

// Consume, process, produce: the handler records a payment and emits
// PaymentCaptured through the outbox, in the dedup middleware's
// transaction. A redelivery changes nothing.
func Example_consumeProcessProduce() {
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
	payment := pgx.Identifier{schema, "payment"}.Sanitize() // the service's own table
	if _, err := pool.Exec(ctx, `CREATE TABLE `+payment+` (order_id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	dedup, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	writer, err := outbox.NewWriter(pool, outbox.WriterConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	handle := func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := core.TxFromContext(msg.Context())
		orderID := msg.Metadata.Get(core.MetadataAggregateID)
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+payment+` (order_id) VALUES ($1)`, orderID); err != nil {
			return nil, err
		}
		_, err := writer.WriteTx(msg.Context(), tx, outbox.Event{
			Topic: "payments", PartitionKey: orderID, EventType: "PaymentCaptured",
			Payload: fmt.Appendf(nil, `{"order_id":%q}`, orderID),
		})
		return nil, err
	}
	// In a service: router.AddConsumerHandler(...).AddMiddleware(dedup.Middleware).
	h := dedup.Middleware(handle)

	msg := message.NewMessage("0190a6b4-6b1c-7c4e-9a55-3f1d2e4c5b6a", []byte(`{}`))
	msg.Metadata.Set(core.MetadataAggregateID, "order-42")
	for range 2 { // the broker delivers it twice
		if _, err := h(msg.Copy()); err != nil {
			log.Fatal(err)
		}
	}
	var payments, events int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+payment).Scan(&payments)
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema, "outbox_event"}.Sanitize()).Scan(&events)
	fmt.Println("payments:", payments, "events emitted:", events)
	// Output: payments: 1 events emitted: 1
}

// Store then process: the receiver accepts messages at once; the processor
// applies them later, once each.
func Example_storeThenProcess() {
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
	payment := pgx.Identifier{schema, "payment"}.Sanitize() // the service's own table
	if _, err := pool.Exec(ctx, `CREATE TABLE `+payment+` (order_id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	receiver, err := inbox.NewReceiver(pool, inbox.ReceiverConfig{Schema: schema, Consumer: "ledger"})
	if err != nil {
		log.Fatal(err)
	}
	processor, err := inbox.NewProcessor(pool, inbox.ProcessorConfig{
		Schema: schema, Consumer: "ledger",
		Handler: func(ctx context.Context, tx pgx.Tx, msg *message.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+payment+` (order_id) VALUES ($1)`, string(msg.Payload))
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	a := message.NewMessage("0190a6b4-6b1c-7c4e-9a55-000000000001", []byte("order-1"))
	b := message.NewMessage("0190a6b4-6b1c-7c4e-9a55-000000000002", []byte("order-2"))
	stored, _ := receiver.Receive(ctx, a, b)
	again, _ := receiver.Receive(ctx, a) // a redelivery
	fmt.Println("stored:", stored, "stored again:", again)

	// In a service: go processor.Run(ctx).
	n, err := processor.ProcessOnce(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("processed:", n)
	// Output:
	// stored: 2 stored again: 0
	// processed: 2
}
