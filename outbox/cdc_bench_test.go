package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// BenchmarkWriteModes measures make bench's write_ratio for both modes: 8
// writers, each transaction a business insert plus one event by WriteTx
// (polling: the log row, its pending row and a coalesced NOTIFY; cdc: the
// log row only), against the business insert plus one plain insert of a
// row as wide as the event.
func BenchmarkWriteModes(b *testing.B) {
	for _, mode := range []string{"plain", "polling", "cdc"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			db := pgtest.NewWith(b, pgtest.Options{MaxConns: 8})
			orders := `"` + db.Schema + `".bench_order`
			if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+orders+` (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer text, amount int);
CREATE TABLE "`+db.Schema+`".bench_plain (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id uuid, topic text, partition_key text, event_type text, payload json, headers jsonb, created_at timestamptz DEFAULT now())`); err != nil {
				b.Fatal(err)
			}
			var w *outbox.Writer
			if mode != "plain" {
				if mode == "cdc" {
					w = cdcSetup(b, db).w
				} else {
					w = newWriter(b, db)
				}
			}
			b.SetParallelism(4) // 4 x GOMAXPROCS(2) = 8 writers
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `INSERT INTO `+orders+` (customer, amount) VALUES ('customer-42', 1234)`); err != nil {
							return err
						}
						if w == nil {
							_, err := tx.Exec(ctx, `INSERT INTO "`+db.Schema+`".bench_plain (event_id, topic, partition_key, event_type, payload, headers) VALUES (gen_random_uuid(), 'orders', 'customer-42', 'OrderPlaced', $1, '{}')`, benchPayload)
							return err
						}
						_, err := w.WriteTx(ctx, tx, outbox.Event{Topic: "orders", PartitionKey: "customer-42", EventType: "OrderPlaced", Payload: benchPayload})
						return err
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
		})
	}
}

// BenchmarkDrainModes drains the same backlog of b.N events (1,000 per
// transaction, 676 keys) with one polling relay and with one CDC relay.
func BenchmarkDrainModes(b *testing.B) {
	for _, mode := range []string{"polling", "cdc"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			brokers := kafkatest.Brokers(b)
			db := pgtest.NewWith(b, pgtest.Options{MaxConns: 8})
			var w *outbox.Writer
			if mode == "cdc" {
				w = cdcSetup(b, db).w
			} else {
				w = newWriter(b, db)
			}
			topic := kafkatest.Topic()
			events := make([]outbox.Event, 0, 1000)
			for i := 0; i < b.N; i++ {
				events = append(events, outbox.Event{Topic: topic, PartitionKey: "key-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)), Payload: benchPayload})
				if len(events) == cap(events) || i == b.N-1 {
					if _, err := w.Write(ctx, events...); err != nil {
						b.Fatal(err)
					}
					events = events[:0]
				}
			}
			pub := newKafkaPublisherB(b, brokers)
			run := func(rctx context.Context) error {
				if mode == "cdc" {
					r, err := outbox.NewCDCRelay(db.Pool, outbox.CDCRelayConfig{RelayConfig: outbox.RelayConfig{Schema: db.Schema, Publisher: pub}})
					if err != nil {
						return err
					}
					return r.Run(rctx)
				}
				r, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: pub})
				if err != nil {
					return err
				}
				return r.Run(rctx)
			}
			b.ResetTimer()
			start := time.Now()
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); _ = run(rctx) }()
			for publishedB(b, db.Pool, db.Schema) < b.N {
				time.Sleep(20 * time.Millisecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			<-done
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
		})
	}
}

func publishedB(b *testing.B, pool *pgxpool.Pool, schema string) int {
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM "`+schema+`".outbox_event WHERE published_at IS NOT NULL`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
