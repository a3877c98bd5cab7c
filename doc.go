// Package millrace holds the small vocabulary that millrace's packages share:
// the metadata keys every outbox event carries on the wire, and the errors a
// publisher uses to say which messages of a batch failed and whether a
// failure is worth retrying.
//
// The working parts live in their own packages:
//
//   - outbox: write events in the business transaction; the relay that ships them.
//   - inbox: exactly-once effects for Watermill handlers, and a store-then-process inbox.
//   - kafka: a batching Watermill publisher for Kafka, readable by watermill-kafka.
//   - migrations: the versioned SQL and a Go API to apply it.
package millrace
