// Package inbox gives Watermill consumers exactly-once effects on
// PostgreSQL (the consumer records each event's id in the transaction of its
// effects, and skips an id it has), in two ways.
//
// # Dedup middleware (the default)
//
// A Deduplicator's Middleware runs each message's handler in a PostgreSQL
// transaction that also inserts (consumer, event id) into processed_event,
// in the same round trip as BEGIN; the primary key turns a duplicate away
// (the source documents' ON CONFLICT DO NOTHING, told apart by its unique
// violation). The handler finds the transaction with
// TxFromContext(msg.Context()) and writes its effects with it; events it
// emits through the outbox (outbox.Writer.WriteTx, or the Writer's
// ContextPublisher, which picks the transaction from the message context)
// commit in the same transaction. So the effects, the dedup mark and the
// outgoing events commit together or not at all:
//
//   - a duplicate delivery finds the mark and is acknowledged without
//     running the handler;
//   - a handler error rolls everything back, the mark too, and the error
//     goes back to Watermill, so Retry or the broker's redelivery runs the
//     handler again (Watermill's in-memory Deduplicator marks before
//     handling and would lose such a message);
//   - a crash mid-handler leaves nothing: the transaction dies with the
//     connection.
//
// Wire it into a Router like this:
//
//	dedup, _ := inbox.NewDeduplicator(pool, inbox.DedupConfig{Consumer: "billing"})
//	poison, _ := middleware.PoisonQueue(publisher, "billing.poison")
//	retry := middleware.Retry{MaxRetries: 5, InitialInterval: 100 * time.Millisecond, ShouldRetry: inbox.ShouldRetry}
//	h := router.AddConsumerHandler("billing", "orders", subscriber, handle)
//	h.AddMiddleware(poison, retry.Middleware, dedup.Middleware) // this order
//
// Order the middleware as above: PoisonQueue outermost, then Retry, then
// the dedup innermost, so that every retry is a fresh transaction.
//
// # Event ids
//
// The event id comes from metadata "event_id" (core.MetadataEventID,
// set by the outbox relay), else the Watermill message UUID; set
// DedupConfig.EventID to choose otherwise. It must be a UUID. A message
// without a usable id fails with an error wrapping ErrNoEventID that names
// the message and is core.Permanent; it is never passed silently.
// inbox.ShouldRetry skips retrying it, and PoisonQueue publishes it to the
// poison topic with the reason in metadata "reason_poisoned". With plain
// PoisonQueue every error that outlives Retry is poisoned; with
// PoisonQueueWithFilter(pub, topic, core.IsPermanent) only permanent
// ones are, and the others are nacked for redelivery.
//
// A retry topic and a dead-letter topic chain the same way: the main
// handler's PoisonQueue publishes to the retry topic, and a handler on the
// retry topic, with the same Deduplicator (same consumer name) and a
// PoisonQueue to the dead-letter topic, applies each event at most once
// whichever copy arrives first.
//
// # Store-then-process inbox
//
// For bursts and critical flows, a Receiver stores each message in
// inbox_event (ON CONFLICT DO NOTHING: redeliveries are ignored) and returns,
// so the broker is acknowledged at once; Receiver.Handle is a Watermill
// NoPublishHandlerFunc, and Receive/ReceiveTx store many messages in one
// statement. The payload is stored byte for byte, whatever it holds. The
// partition key, the subscribe topic and the metadata (keys and values) go
// to text and jsonb columns, which cannot hold NUL and would turn invalid
// UTF-8 into U+FFFD: a message with such text is refused, not changed,
// with an error wrapping ErrUnstorable that names the message and the
// field and is core.Permanent (ShouldRetry stops, a PoisonQueue takes
// it). Every message of a call is checked before anything is sent, so
// nothing of a refused call is stored and a caller's transaction given to
// ReceiveTx is left as it was. What is stored comes back to the handler
// byte for byte.
//
// A Processor applies the stored messages at its own pace: each batch
// claims unprocessed rows with FOR UPDATE SKIP LOCKED (any number of
// processors share the work and never apply a row twice), runs the handler
// for each row under a savepoint in the batch's transaction, and marks the
// row processed in that transaction. A failure rolls back that row's writes
// and records attempts, last_error and next_attempt_at (capped exponential
// backoff from RetryMin to RetryMax, as the outbox Relay names them); after
// MaxAttempts, or at once for a core.Permanent error, the row is
// dead-lettered. A handler that swallows an SQL error and returns nil has
// left the transaction aborted: the Processor sees it, rolls back to the
// row's savepoint and charges the row an attempt with that reason, and the
// rest of the batch goes on.
//
// With OrderByKey, rows with the same partition key are applied in arrival
// order, and a key whose row is waiting (backing off, dead, or in another
// processor's batch) holds its later rows, and only them: held rows are
// left out before the batch's LIMIT, so a key with a dead letter and any
// number of rows behind it never keeps other keys waiting. Several
// processors with OrderByKey stay correct but contend for the same keys;
// one Processor (with a larger BatchSize) drains an ordered inbox as fast.
//
// # Dead letters
//
// DeadLetters (Processor.DeadLetters, or NewDeadLetters) lists, requeues
// and discards an inbox's dead letters, with the outbox Admin's shapes:
// List takes core.ListParams (Limit, default 100; AfterID to page by
// DeadLetter.ID; Topic and PartitionKey filters; a negative value is an
// error wrapping core.ErrInvalidListParams). Requeue and Discard take
// event ids and return how many they changed; ids that are not dead
// letters of the inbox are ignored, and an id that is not a UUID fails the
// whole call with an error wrapping core.ErrInvalidEventID before
// anything is sent, so RequeueTx and DiscardTx leave the caller's
// transaction usable.
//
// In bulk, by a query (core.DeadLetterQuery, the outbox's too: topic,
// partition key, a SQL LIKE match on the last error, died before a time):
// DryRun counts what it selects and lists the first page, changing
// nothing; RequeueMatching and DiscardMatching act on it through List and
// Requeue or Discard, 500 per transaction, and return how many they
// changed (one requeued or discarded meanwhile by someone else is not
// counted).
//
// # Configuration errors
//
// Every constructor checks its Config and returns an error wrapping
// core.ErrConfig (a nil pool, a missing or unstorable Consumer, an
// invalid Schema, a negative value, RetryMax below RetryMin).
// core.ErrConfig is the same value, kept for existing callers.
//
// # Retention
//
// The service runs retention (millrace.Config.Retention): it deletes
// processed_event marks and processed inbox rows older than its Marks
// window (7 days by default), in small batches; an inbox row not yet
// processed stays. The window must outlast the longest redelivery or replay horizon (broker retention
// you may rewind over, replays from the outbox, the longest outage after
// which old messages may still arrive): a duplicate that arrives after its
// mark was deleted is applied again.
//
// # Tables
//
// Migration 002_inbox (package migrations) creates processed_event and
// inbox_event in millrace's schema; every Config takes the schema name.
package inbox
