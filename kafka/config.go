package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// DefaultSaramaConfig returns sarama producer settings for a real Kafka
// cluster, for producers other than Publisher (which uses franz-go), such as
// watermill-kafka's Publisher: protocol version 3.6, an idempotent producer
// (acks=all, one in-flight request per connection, retries on), producer
// successes and errors returned, and a 10-second dial timeout so an
// unreachable broker is reported instead of hanging. The result is yours to
// change.
func DefaultSaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "millrace"
	c.Net.DialTimeout = 10 * time.Second
	c.Net.MaxOpenRequests = 1
	c.Metadata.AllowAutoTopicCreation = true
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewHashPartitioner
	c.Producer.Compression = sarama.CompressionNone
	c.Producer.Flush.Frequency = 0
	c.Producer.Flush.MaxMessages = 0
	return c
}

// DefaultSaramaSubscriberConfig returns consumer settings for reading what
// millrace publishes with watermill-kafka's subscriber: protocol version 3.6
// and reading from the oldest offset when a group has none.
func DefaultSaramaSubscriberConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_6_0_0
	c.ClientID = "millrace"
	c.Net.DialTimeout = 10 * time.Second
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	return c
}
