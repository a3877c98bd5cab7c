package kafka_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
)

// BenchmarkSubscriber reads b.N messages, published beforehand, through
// Subscriber's batch interface, its per-message Subscribe and watermill-kafka's subscriber
// (one message in flight per partition), on the embedded broker with one
// and with 32 partitions. It reports messages/s.
//
//	go test -run '^$' -bench BenchmarkSubscriber ./kafka/
func BenchmarkSubscriber(b *testing.B) {
	for _, parts := range []int{1, 32} {
		for _, kind := range []string{"batch", "per-message", "watermill-kafka"} {
			b.Run(fmt.Sprintf("%s/partitions=%d", kind, parts), func(b *testing.B) {
				broker := kafkatest.Embedded(b, devkafka.Config{Partitions: parts})
				brokers, topic := broker.Addrs(), kafkatest.Topic()
				pub := newPublisher(b, brokers)
				const chunk = 5000
				for i := 0; i < b.N; i += chunk {
					var msgs []*message.Message
					for j := i; j < min(i+chunk, b.N); j++ {
						msgs = append(msgs, newMessage(j, "key-"+strconv.Itoa(j%256)))
					}
					if err := pub.Publish(topic, msgs...); err != nil {
						b.Fatal(err)
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				b.ResetTimer()
				start := time.Now()
				read := 0
				switch kind {
				case "batch":
					ch, err := newSub(b, brokers, kafkatest.Group()).SubscribeBatch(ctx, topic)
					if err != nil {
						b.Fatal(err)
					}
					for read < b.N {
						select {
						case bt := <-ch:
							read += len(bt.Messages)
							bt.Ack()
						case <-ctx.Done():
							b.Fatalf("read %d of %d", read, b.N)
						}
					}
				case "per-message":
					ch, err := newSub(b, brokers, kafkatest.Group()).Subscribe(ctx, topic)
					if err != nil {
						b.Fatal(err)
					}
					for read < b.N {
						select {
						case m := <-ch:
							read++
							m.Ack()
						case <-ctx.Done():
							b.Fatalf("read %d of %d", read, b.N)
						}
					}
				default:
					ch, err := kafkatest.NewSubscriber(b, brokers).Subscribe(ctx, topic)
					if err != nil {
						b.Fatal(err)
					}
					for read < b.N {
						select {
						case m := <-ch:
							read++
							m.Ack()
						case <-ctx.Done():
							b.Fatalf("read %d of %d", read, b.N)
						}
					}
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			})
		}
	}
}
