// Package millrace runs a service's reliable workflows with one value, the
// way river's Client runs a job queue: New builds a Service from one
// Config, and Service.Run runs the outbox relay, the saga orchestrator's
// reply handlers and timers, the participants' command handlers and the
// retention jobs until its context ends.
//
// The working parts live in their own packages:
//
//   - core: the shared vocabulary (metadata keys, the saga wire protocol, errors).
//   - outbox: write events in the business transaction; the relay that ships them.
//   - inbox: exactly-once effects for Watermill handlers, and a store-then-process inbox.
//   - compensation: saga participants behind a barrier against duplicate, empty and late compensations.
//   - saga: saga definitions, their state in PostgreSQL, and the orchestrator.
//   - kafka: a batching Watermill publisher and subscriber for Kafka.
//   - migrations: the versioned SQL and a Go API to apply it.
//   - console: a web console for operators, mounted on a service's own mux.
package millrace
