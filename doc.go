// Package millrace holds the small vocabulary that millrace's packages share:
// the metadata keys every outbox event carries on the wire, the saga wire
// protocol (commands and replies between the orchestrator and its
// participants), the errors a publisher uses to say which messages of a batch
// failed and whether a failure is worth retrying, the one config error
// sentinel (ErrConfig), and the dead-letter listing parameters (ListParams).
//
// The working parts live in their own packages:
//
//   - outbox: write events in the business transaction; the relay that ships them.
//   - inbox: exactly-once effects for Watermill handlers, and a store-then-process inbox.
//   - compensation: saga participants behind a barrier against duplicate, empty and late compensations.
//   - saga: saga definitions, their state in PostgreSQL, and the orchestrator.
//   - kafka: a batching Watermill publisher for Kafka, readable by watermill-kafka.
//   - migrations: the versioned SQL and a Go API to apply it.
//   - console: a web console for operators, mounted on a service's own mux.
package millrace
