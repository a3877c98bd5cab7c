// Package kafka publishes Watermill messages to Kafka in batches, for the
// outbox relay and for anyone who needs Kafka throughput from Watermill.
//
// # Why batching
//
// watermill-kafka's Publisher sends the messages of a Publish call one at a
// time and waits for each acknowledgement: about 7k messages/s against a
// broker on loopback. Publisher here hands the whole call to a sarama
// SyncProducer's SendMessages, which packs the records into produce requests
// per partition and waits once: about 330k messages/s in calls of 1000 on the
// same machine. The relay publishes a claimed batch in one call.
//
//	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{"127.0.0.1:9092"}}, logger)
//	...
//	err = p.Publish("orders", msgs...) // one batch, all acknowledged or listed in the error
//
// The default sarama configuration (DefaultSaramaConfig) is meant for a real
// cluster: idempotent producer, acks from all in-sync replicas, one request
// in flight per connection, so records of one partition key are written once
// and in order.
//
// # Reading it back
//
// Records use watermill-kafka's marshaling: the message UUID in the
// "_watermill_message_uuid" header, metadata as headers, the payload as value
// and the metadata millrace.MetadataPartitionKey as record key. Any
// watermill-kafka Subscriber reads them:
//
//	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
//		Brokers:               brokers,
//		Unmarshaler:           kafka.DefaultMarshaler(), // or wkafka.DefaultMarshaler{}
//		OverwriteSaramaConfig: kafka.DefaultSaramaSubscriberConfig(),
//		ConsumerGroup:         "billing",
//	}, logger)
//
// DefaultSaramaSubscriberConfig sets the protocol version (sarama's consumer
// groups need one that the brokers speak) and starts a new group at the
// oldest offset. The record key is in the message context:
// wkafka.MessageKeyFromCtx(msg.Context()).
//
// # Errors
//
// Publish returns nil when every message was acknowledged. Otherwise it
// returns a *millrace.BatchError that lists each failed message by UUID; the
// messages it does not list were delivered. Each message error is marked
// with millrace.Permanent when sending the same message again cannot succeed:
//
//   - larger than the producer's Producer.MaxMessageBytes (refused before
//     sending) or than the broker accepts (MESSAGE_TOO_LARGE,
//     RECORD_LIST_TOO_LARGE); these also match ErrMessageTooLarge;
//   - rejected by the broker as corrupt or invalid (CORRUPT_MESSAGE,
//     INVALID_FETCH_SIZE, INVALID_RECORD, INVALID_TIMESTAMP,
//     UNSUPPORTED_FOR_MESSAGE_FORMAT, POLICY_VIOLATION), or for its topic
//     (INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED);
//   - refused by the Marshaler (ErrMarshal), for instance because its
//     metadata uses the reserved "_watermill_message_uuid" key.
//
// Everything else is retryable: brokers down or unreachable, timeouts,
// leadership changes, unknown topics, cluster-wide authorization or
// configuration faults (marking those permanent would dead-letter every
// message), and ErrClosed after Close.
//
// During an outage sarama's producer opens a per-topic circuit breaker (not
// configurable) that would refuse records with "circuit breaker is open" for
// 10 seconds even after the brokers are back. When a Publish meets an open
// breaker, the Publisher replaces its producer with a new one as soon as the
// brokers answer (trying at most once a second), so delivery resumes about a
// second after they return; retry the failed messages meanwhile.
//
// Order per key when a message fails: a message refused before sending (too
// large for Producer.MaxMessageBytes, or not marshalable) holds back the later
// messages of its key in the same call, which fail with the temporary
// ErrHeldBack instead of overtaking it. A broker rejects a partition's
// records of one request together, so they fail together. A caller that must
// keep the order per key (the outbox relay does) also holds a key back after
// its first failure rather than sending later messages of it in the next call.
package kafka
