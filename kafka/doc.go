// Package kafka publishes Watermill messages to Kafka in batches, for the
// outbox relay and for anyone who needs Kafka throughput from Watermill,
// without ever storing a message of a key ahead of an earlier one
// of that key that failed. Subscriber reads them back in consumer groups,
// one message or one core.Batch of a partition at a time (see Consuming
// with Subscriber).
//
// # Why batching
//
// watermill-kafka's Publisher sends the messages of a Publish call one at a
// time and waits for each acknowledgement: about 7k messages/s against a
// broker on loopback. Publisher here hands the whole call to franz-go's
// idempotent producer, which packs the records into produce requests per
// partition and pipelines them, and waits once. PublishTopics does the
// same for several topics at once: since calls go out one at a time, a
// Publish call per topic waits for a round of acknowledgements each
// (tens of milliseconds with acks from all replicas of a real cluster).
// The relay publishes a claimed batch in one call, PublishTopics when it
// holds several topics.
//
//	p, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: []string{"127.0.0.1:9092"}}, logger)
//	...
//	err = p.Publish("orders", msgs...) // one batch, all acknowledged or listed in the error
//	err = p.PublishTopics(map[string][]*message.Message{"orders": orders, "payments": payments})
//
// The defaults are meant for a real cluster: an idempotent producer, acks
// from all in-sync replicas, sarama's hash partitioner (keys land where
// watermill-kafka's own Publisher puts them). Add TLS, SASL or other
// franz-go options with PublisherConfig.ClientOptions.
//
// # Order per key
//
// Publish guarantees that a message is never stored after an earlier
// message of its record key, in the same call, that failed (PublishTopics:
// of its topic and key). The record key is the one the Marshaler gives the
// message: with DefaultMarshaler, its core.MetadataPartitionKey. How:
//
//   - Publish calls go out one at a time. All records of a call are buffered
//     before the first is sent (franz-go's manual flushing), then flushed.
//     Should the client still send some early (its previous flush winding
//     down) and one of them fail while the call is being buffered, the
//     buffering stops and the call's unsent batches are cancelled, failing
//     temporarily rather than going out behind the failure. A record that
//     fails before it is placed in a partition (its topic's metadata did
//     not load) stops nothing: it endangers no other record's order.
//   - franz-go's idempotent producer numbers each partition's batches; the
//     broker stores them only in sequence, and when a batch fails for good
//     (refused, out of retries, timed out) the client fails every record
//     buffered behind it in that partition (its documentation of
//     RecordRetries and RecordDeliveryTimeout: "This ensures gapless
//     ordering"). A key's records all go to one partition.
//   - A record refused before sending (too large for its topic, or not
//     marshalable) holds back the later messages of its key, which fail
//     with the temporary ErrHeldBack. A message the Marshaler refuses
//     without saying the key it would have had (see Marshaler) holds back
//     every later message of its topic in the call.
//   - A batch the broker refuses for a reason that may be one record's
//     (INVALID_RECORD, MESSAGE_TOO_LARGE, ...) is sent again record by
//     record, one per partition at a time, in order, a key held back after
//     its first failure; the record that fails alone is the one at fault.
//   - Each topic's limit is the lower of MaxMessageBytes and the topic's
//     max.message.bytes as the cluster describes it (DescribeConfigs, read
//     once per topic); batches are capped at it, so a broker does not refuse
//     a batch for size that the client split differently. If the limit is
//     lowered while the Publisher runs, the refused records are sent again
//     alone, each judged by its own topic's limit, and the client is
//     renewed with the lower limit. A record over the limit in use has it
//     read again (it may have been raised). Whenever the limit in use is
//     not what the client's batches of the topic were sized for (a topic
//     described late, or created after a first try), the client is renewed
//     before the records go out.
//   - A message that carries the metadata core.MetadataPartitionKey is
//     keyed by it (see Marshaler): the outbox relay holds a failed event's
//     later events back by partition key, so the record key must be it.
//
// A caller that must keep the order across calls (the outbox relay does)
// holds a key back after its first failure rather than sending later
// messages of it in the next call. Order is per topic and record key. In a
// PublishTopics call each topic fails on its own: a topic that is missing
// or refused fails its messages only.
//
// NewPublisher refuses client options that would break this:
// kgo.DisableIdempotentWrite (without idempotence a retried request can land
// behind a later one: up to five requests are in flight per broker),
// kgo.TransactionalID and kgo.ManualFlushing; errors wrap core.ErrConfig.
//
// Outages: a record waits for the brokers up to the delivery timeout (30 s,
// DefaultDeliveryTimeout; kgo.RecordDeliveryTimeout changes it) and then
// fails, temporary, with the rest of its partition. A record whose request
// was sent but not answered may still have been stored: sent again, it is
// a duplicate (at-least-once), never out of order, since the broker fences
// the producer epoch the client abandons.
//
// # Reading it back
//
// A Marshaler turns a message into a franz-go record, an Unmarshaler a
// record into a message. DefaultMarshaler writes watermill-kafka's record
// format: the message UUID in the "_watermill_message_uuid" header,
// metadata as headers, the payload as value and the metadata
// core.MetadataPartitionKey as record key. Any watermill-kafka Subscriber
// reads them, with its own DefaultMarshaler; sarama's consumer groups need
// a protocol version the brokers speak:
//
//	sc := sarama.NewConfig()
//	sc.Version = sarama.V3_6_0_0
//	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
//	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
//		Brokers:               brokers,
//		Unmarshaler:           wkafka.DefaultMarshaler{},
//		OverwriteSaramaConfig: sc,
//		ConsumerGroup:         "billing",
//	}, logger)
//
// The record key is in the message context:
// wkafka.MessageKeyFromCtx(msg.Context()). Package kafka itself links
// neither sarama nor watermill-kafka.
//
// # Consuming with Subscriber
//
// Subscriber is a Watermill message.Subscriber for consumer groups on
// franz-go. It reads what Publisher and watermill-kafka's Publisher write
// (DefaultUnmarshaler: the UUID header, metadata as headers), rebalances
// cooperatively (cooperative-sticky: a member joining or leaving moves only
// the partitions that must move) and commits, per partition, only the
// offset after the messages acknowledged in order:
//
//	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
//		Brokers:       brokers,
//		ConsumerGroup: "billing", // required
//	}, logger)
//	msgs, err := sub.Subscribe(ctx, "orders")          // one message per partition at a time
//	batches, err := sub.SubscribeBatch(ctx, "orders")  // or many per partition, as a *core.Batch
//
// Subscribe keeps Watermill's semantics, one message of a partition in
// flight at a time, as watermill-kafka's subscriber does; a nacked message
// comes again after NackResendSleep. SubscribeBatch hands out what a
// partition has buffered, up to MaxBatch records, as one Batch; a
// partition has one Batch in flight, partitions run concurrently. Ack and
// Nack act on a whole Batch, or ack and nack its messages one by one. Once
// every message of a Batch is acked or nacked, the offset after its acked
// prefix is committed (every CommitInterval, on revoke and on Close) and a
// nacked message is delivered again with every message after it in its
// partition, acked or not: nothing behind a nacked message is committed
// past it.
//
// A new group starts at the oldest record (InitialOffset). A partition the
// group takes away (another member joined) waits up to RevokeGrace for its
// messages in flight to be acknowledged, commits, and is handed over; what
// was not acknowledged by then is delivered again to its next owner.
// Delivery is at least once: after a rebalance or a crash, a run of a
// partition's messages may come twice, in order.
//
// The record (its partition, offset, timestamp, key and headers) is in the
// message context: RecordFromContext. It reads this Subscriber's messages
// only: a message from watermill-kafka's subscriber has its values under
// watermill-kafka's own accessors (wkafka.MessageKeyFromCtx, ...), which in
// turn do not see this Subscriber's.
//
// Records not written by a Watermill publisher: one with no UUID header (or
// an empty one) gets a UUID derived from its place, the same on every
// delivery, so deduplication still works: the name-based (version 5) UUID,
// in namespace 5b1e0c1e-6f0a-4a8e-9a57-6d696c6c7261, of
// "<topic>/<partition>/<offset>"; header bytes come through as
// they are. A record the Unmarshaler refuses (DefaultUnmarshaler refuses
// none) is logged as an error with its topic, partition and offset and
// skipped: it is passed like an acked message and stays in the topic.
//
// Against the embedded broker (go test -bench BenchmarkSubscriber
// ./kafka/, 100,000 messages, 2 shared cores) the batch interface reads
// about 400k messages/s from one partition and 260k/s from 32;
// watermill-kafka's subscriber, acking each message, 200k/s and 140k/s.
//
// # Errors
//
// Publish returns nil when every message was acknowledged. Otherwise it
// returns a *core.BatchError that lists each failed message by UUID; the
// messages it does not list were delivered. Each message error is marked
// with core.Permanent when sending the same message again cannot succeed:
//
//   - larger than its topic takes (ErrMessageTooLarge), refused before
//     sending or by the broker when alone in its batch;
//   - refused by the broker, alone in its batch, as corrupt or invalid
//     (CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP,
//     UNSUPPORTED_FOR_MESSAGE_FORMAT, POLICY_VIOLATION);
//   - refused for its topic's name (a name ValidateTopic refuses, checked
//     before sending, or INVALID_TOPIC_EXCEPTION): every message of the
//     topic;
//   - refused by the Marshaler (ErrMarshal), for instance by
//     DefaultMarshaler because its metadata uses the reserved
//     "_watermill_message_uuid" key.
//
// A topic the cluster does not have and does not create
// (UNKNOWN_TOPIC_OR_PARTITION once the client waited for it) and a topic
// the producer may not write to (TOPIC_AUTHORIZATION_FAILED) fail their
// messages as the topic's fault, neither permanent nor temporary: an
// operator may fix either, and the outbox relay charges an attempt, backs
// off and dead-letters the event after its MaxAttempts (a choice: a brief
// ACL mistake or a topic created late costs retries, not dead letters). A
// missing topic's messages then fail at once, without waiting for the
// cluster, until it is looked for again a second later.
//
// Errors that sending again later will fix say so: they (or an error they
// wrap) have a Temporary() bool method returning true, which the outbox
// relay reads and charges no attempt for: the
// brokers down or unreachable, timeouts, Kafka errors marked retriable
// (NOT_LEADER_FOR_PARTITION, ...), ErrHeldBack, ErrClosed, and every error
// not known to be a message's or its topic's fault (cluster-wide
// authorization or configuration faults, which fail every message alike
// until an operator fixes them).
package kafka
