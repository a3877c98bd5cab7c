// Package outbox writes events in the business transaction and ships them
// to Kafka (or any Watermill publisher): the transactional outbox.
//
// # Writing
//
// A Writer inserts events in the caller's pgx transaction, so the domain
// change and its events commit together or not at all:
//
//	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{})
//	tx, _ := pool.Begin(ctx)
//	tx.Exec(ctx, `UPDATE orders SET status = 'placed' WHERE id = $1`, id)
//	w.WriteTx(ctx, tx, outbox.Event{
//		Topic:        "orders",
//		PartitionKey: customerID, // events of one key are published in commit order
//		EventType:    "OrderPlaced",
//		Payload:      payload,    // JSON, stored as jsonb; set Binary for opaque bytes
//	})
//	tx.Commit(ctx)
//
// Many events go in one round trip. Bad input (no topic, an empty partition
// key, an id that is not a UUID, a payload that is not JSON) is an
// *EventError reported before anything is sent.
//
// Code written against Watermill writes to the outbox unchanged through
// Writer.TxPublisher (bound to one transaction) or Writer.ContextPublisher
// (the transaction travels in the message context, see
// millrace.ContextWithTx; the inbox middleware puts its transaction there),
// including Watermill's CQRS event bus.
//
// # The relay
//
// A Relay claims pending events, publishes them in batches and marks them
// published, in one transaction per batch:
//
//	pub, _ := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, logger)
//	relay, _ := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub})
//	go relay.Run(ctx) // returns when ctx ends, after finishing the batch in flight
//
// Run as many relays as you like, in one process or many. Partition keys
// hash into 128 lanes; a batch locks the lanes it works on with SELECT ...
// FOR NO KEY UPDATE SKIP LOCKED (R-DIST-OBX-1) for as long as it takes to
// claim, publish and mark it, so a key's events are in flight from one relay
// at a time, and a relay that dies drops its locks with its connection.
// Claims go by state, never by a cursor over ids: a transaction that commits
// late with a lower id is still published.
//
// Delivery is at least once. A relay that dies after the broker acknowledged
// a batch and before its mark committed publishes the batch again; consumers
// deduplicate on the event id (package inbox does).
//
// Wake-ups: writers send a coalesced NOTIFY hint (at most one per
// WriterConfig.NotifyInterval per Writer, never one per transaction: a
// NOTIFY takes a global lock at commit), relays LISTEN for it and poll as a
// fallback. Behind a connection pooler in transaction mode, set
// RelayConfig.PollOnly and a negative WriterConfig.NotifyInterval.
//
// # Failures
//
// When the broker is down every publish fails: the relay backs off (capped
// at RelayConfig.OutageBackoffMax), charges no attempts, and the backlog
// waits in PostgreSQL, bounded in the relay's memory by BatchSize. What
// becomes of an event that fails while others go out depends on what its
// publisher says of the error:
//
//   - permanent (millrace.Permanent: too large, invalid, a topic Kafka
//     refuses): dead-lettered at once, with its reason;
//   - temporary (an error with a Temporary() bool method returning true, as
//     kafka.Publisher reports a broker or partition away, a timeout or a
//     leader election; any net.Error): no attempt charged, tried again after
//     RelayConfig.RetryMin, however long it lasts;
//   - anything else: charged an attempt, retried with capped exponential
//     backoff, and dead-lettered after RelayConfig.MaxAttempts.
//
// A dead letter keeps its last error; everything else keeps flowing. Later
// events of its key wait behind a failed or dead event, so per-key order
// holds, unless RelayConfig.SkipDeadLetteredKeys is set.
//
// How a failure is told apart from an outage: a batch in which every event
// failed with an error not marked permanent counts as an outage. So does a
// publisher that fails whole calls (no *millrace.BatchError) when, sending
// the batch one message at a time to find the one at fault, the relay meets
// a failure that is not permanent: it stops there, keeps what went out, and
// backs off. A *millrace.BatchError naming a message the call did not hold
// fails the whole call: the relay cannot tell what was delivered. An event
// that fails alone with an error its publisher does not mark permanent
// waits as in an outage instead of being dead-lettered; millrace's Kafka
// publisher marks the errors retrying cannot fix, and a publisher of your
// own should too.
//
// An Admin lists, requeues and discards dead letters, replays published
// events with their original ids (R-DIST-OBX-3, to rebuild a read model) and
// reports the backlog; a Cleaner deletes published events older than the
// retention window in small batches; Metrics exposes it all to Prometheus.
//
// # Tables
//
// outbox_event is the log: every event, kept after publication for audit
// and replay until the Cleaner removes it. outbox_pending is the unpublished
// set, one narrow row per event; it plays the part of the partial index
// "WHERE published_at IS NULL" and is far cheaper to claim from and delete
// from than updating an indexed column of the log. outbox_lane holds one row
// per lane. See migrations/sql/001_outbox.up.sql.
package outbox
