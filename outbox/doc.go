// Package outbox writes events in the business transaction and ships them
// to Kafka (or any Watermill publisher): the transactional outbox.
//
// # Writing
//
// A Writer inserts events in the caller's pgx transaction, so the domain
// change and its events commit together or not at all:
//
//	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{
//		ValidateTopic: kafka.ValidateTopic, // relaying to Kafka: refuse names Kafka refuses
//	})
//	tx, _ := pool.Begin(ctx)
//	tx.Exec(ctx, `UPDATE orders SET status = 'placed' WHERE id = $1`, id)
//	w.WriteTx(ctx, tx, outbox.Event{
//		Topic:        "orders",
//		PartitionKey: customerID, // events of one topic and key are published in commit order
//		EventType:    "OrderPlaced",
//		Payload:      payload,    // JSON, delivered byte for byte; set Binary for opaque bytes
//	})
//	tx.Commit(ctx)
//
// Many events go in one round trip. Bad input (no topic, an empty partition
// key, an id that is not a UUID, a payload that is not JSON, text with a NUL
// byte or invalid UTF-8, a topic or key over MaxKeyBytes, metadata that
// cannot travel unchanged, a topic WriterConfig.ValidateTopic refuses, one
// id twice for one topic) is an *EventError reported before anything is
// sent: the transaction is untouched and can still commit; Writer.Validate
// reports the same without writing; its error wraps ErrInvalidEvent, and
// names the field. WriteTx with a nil transaction returns an error wrapping
// ErrNoTx, with no events one wrapping ErrInvalidEvent.
//
// What is written is what is delivered: the payload byte for byte (JSON is
// stored as PostgreSQL json, which keeps the text as written: key order,
// duplicate keys, number spelling, \u0000 escapes), the metadata as given.
//
// An event is identified by its id and topic together. The id travels as
// the Watermill message UUID and the event_id metadata; one id may be
// written to several topics (a message copied to two topics, msg.Copy()
// keeps the UUID), once per topic. A consumer's inbox deduplicates on
// (consumer, event id): a consumer that reads several topics under one
// consumer name applies such copies once, which is what a copy means; give
// each topic's handler a consumer name of its own to apply each copy.
//
// Code written against Watermill writes to the outbox through
// Writer.TxPublisher (bound to one transaction) or Writer.ContextPublisher
// (the transaction travels in the message context, see
// core.ContextWithTx; the inbox middleware puts its transaction there).
// Plain Watermill messages work, including those of Watermill's CQRS event
// bus: a message with partition_key (else aggregate_id) metadata is ordered
// by that key; one without is keyed by its UUID, a key of its own, and so
// comes with no ordering promise. A payload is stored as JSON when it is
// JSON and as bytes when it is not (content_type metadata
// application/octet-stream or application/json decides explicitly). Both
// publishers write with the message's context, and publishing no messages
// returns an error wrapping ErrInvalidEvent, as WriteTx does. Watermill's conformance suite
// (pubsub/tests) runs against this path: publish in a transaction, relay to
// Kafka, read with watermill-kafka's subscriber.
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
// Run probes the outbox tables at start and returns an error at once when
// they are missing or the role lacks a privilege; later failures are logged
// (by default to slog.Default(), errors only) and retried.
//
// Run as many relays as you like, in one process or many. Partition keys
// hash into 128 lanes; a batch locks the lanes it works on with SELECT ...
// FOR NO KEY UPDATE SKIP LOCKED (relays skip each other's rows instead of
// waiting on them) for as long as it takes to claim, publish and mark it,
// so a key's events are in flight from one relay at a time, and a relay
// that dies drops its locks with its connection.
// Order is per topic and partition key: events of one topic and key are
// published in commit order; events of one key written to two topics leave
// grouped by topic (one Publish call per topic, or one PublishTopics call
// of a TopicsPublisher such as kafka.Publisher for the whole batch), as
// Kafka orders within a topic partition only. A failed event holds back
// its key's later events of its topic in the batch; once it is back in
// the pending set, blocked, it holds its key's events of every topic until
// it goes out.
//
// Pool sizing: a relay holds one pool connection per worker
// (RelayConfig.Workers) for the length of a batch, and one more for LISTEN,
// which it opens through the pool and then takes out of it for good. Give
// the pool MaxConns >= Workers plus what the process itself uses, and count
// Workers + 1 connections per relay against max_connections. If the
// process holds every connection of the pool, batches wait for one
// (nothing is lost, the backlog grows), and Run still returns promptly when
// its context ends.
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
//   - permanent (core.Permanent: too large, invalid, a topic Kafka
//     refuses; and what transports without typed errors say of a message
//     they never take: NATS "maximum payload exceeded", Redis "invalid bulk
//     length"): dead-lettered at once, with its reason;
//   - temporary (an error with a Temporary() bool method returning true, as
//     kafka.Publisher reports a broker or partition away, a timeout or a
//     leader election; any net.Error): no attempt charged, tried again after
//     RelayConfig.RetryMin, however long it lasts;
//   - anything else (for kafka.Publisher, a topic missing or not
//     authorized): charged an attempt, retried with capped exponential
//     backoff, and dead-lettered after RelayConfig.MaxAttempts.
//
// A dead letter keeps its last error; everything else keeps flowing. Later
// events of its key wait behind a failed or dead event, so per-key order
// holds, unless RelayConfig.SkipDeadLetteredKeys is set. A publisher's
// failure names its message by UUID and topic (core.MessageError.Topic):
// an event written to several topics (a fan-out) is one message per topic,
// and only the copy that failed is retried or dead-lettered; the event's
// copies on other topics do not wait behind it (later events of the key,
// in every topic, do).
//
// How a failure is told apart from an outage: a batch in which every event
// failed, each failure temporary, counts as an outage. A publisher that
// fails whole calls (no *core.BatchError) has the batch sent again one
// message at a time to find the messages at fault: an event that fails
// while other messages of the pass go out is at fault, and charged (even
// if its error says temporary: Redis drops the connection on a payload it
// refuses), and three failures in a row are an outage: the search stops
// there, keeps what went out, charges nothing, and backs off. An event
// alone in its batch whose call fails says nothing, unless it was found at
// fault before. A *core.BatchError naming a message the call did not hold
// fails the whole call: the relay cannot tell what was delivered.
//
// An Admin lists, requeues and discards dead letters (one by one, or in
// bulk by a DeadLetterQuery: DryRun, RequeueMatching,
// DiscardMatching), replays published
// events with their original ids (so a consumer can rebuild a read model
// from the log, and skip what it applied) and
// reports the backlog; Metrics exposes it all to Prometheus. The service
// runs retention (millrace.Config.Retention): it deletes events published
// or discarded longer ago than its Events window (7 days by default), in
// small batches, never one that is pending, dead or queued for replay.
//
// # Change data capture
//
// A CDCRelay is the other way to ship events: instead of claiming pending
// rows, it streams the committed inserts of outbox_event from the WAL by
// logical replication (the pgoutput plugin, a publication on outbox_event
// with publish = 'insert', one replication slot per relay group), and the
// Writer, with WriterConfig.CDC, inserts the log row only:
//
//	admin.CreateCDC(ctx, "")                  // once, at deploy time: the publication and the slot
//	w, _ := outbox.NewWriter(pool, outbox.WriterConfig{CDC: true})
//	relay, _ := outbox.NewCDCRelay(pool, outbox.CDCRelayConfig{
//		RelayConfig: outbox.RelayConfig{Publisher: pub},
//	})
//	go relay.Run(ctx)
//
// It publishes in commit order (a key's events follow WAL order), in
// batches, marks them published (published_at, as the polling relay does),
// and only then confirms the slot's position: a relay killed, a broker
// away or a PostgreSQL restart streams again from the last confirmed
// position. Nothing is lost, delivery is at least once. The relays of a
// group share the slot; one streams, the others stand by.
//
// When to choose it: the write costs one insert instead of two (no
// outbox_pending row, no NOTIFY), and the relay does not poll; choose it
// when the write path's cost matters and you run the server (wal_level =
// logical needs a restart and a role with REPLICATION). What it costs: a
// slot, which keeps every WAL segment its relays have not confirmed. A
// relay group stopped for good keeps WAL until the disk fills, the most
// common outage of CDC setups. So:
//
//   - set max_slot_wal_keep_size (e.g. '10GB', below the free disk): past
//     it the server invalidates the slot instead of filling the disk;
//   - alert on millrace_outbox_cdc_slot_lag_bytes (read at scrape time from
//     pg_replication_slots, so it shows a slot nobody reads) and
//     cdc_slot_age_seconds; cdc_slot_active says whether a relay streams;
//   - DropCDC a group you retire (it also queues what the slot held for a
//     polling Relay).
//
// An invalidated slot (its WAL is gone) is reported loudly: an error log,
// the cdc_slot_invalidated gauge, the cdc_slot_invalidations_total counter.
// The next CDC relay to start (or reconnect) creates a new slot and queues
// every unpublished event of the log (published_at and discarded_at null)
// into the pending set, where the relay's polling half publishes it:
// nothing is lost, some events are published twice, and the queueing scans
// outbox_event once.
//
// Failures go as in polling mode, through the pending set: an event that
// fails while others go out is recorded there (a dead letter with its
// reason, or a retry with backoff), and the later events of its key that
// the stream delivers are handed there too, behind it, so per-key order
// holds (unless SkipDeadLetteredKeys); the Admin lists, requeues and
// discards dead letters and replays events as before, and the CDC relay's
// polling half (a Relay over the pending set, configured by
// CDCRelayConfig.RelayConfig) publishes them. Admin.Stats counts the
// pending set only: the backlog still in the WAL is the slot's lag. A
// whole batch that fails (the broker is away) is retried, unconfirmed,
// while the slot holds the WAL and the outbox grows; a relay stopped
// meanwhile tries its batch once more and returns, leaving it unconfirmed.
//
// The stream and the polling half never publish events of one key at the
// same time: a stream batch holds the lanes of its keys (as a polling
// batch does) from its look at the pending set to its marks, so an event
// handed to the polling half (a retry, a requeued dead letter, a replay)
// and the stream's new events of its key do not interleave. An event the
// stream delivers again (after a crash, a restart, a slot position saved
// before it) is not published again if it was published, discarded or
// dead-lettered meanwhile. The relay's replication connection sets
// bytea_output = hex, whatever the server, database or role sets.
//
// Switching, in order per key throughout: on a schema set up for CDC the
// stream also publishes what a polling Writer writes (every insert is in
// the stream, in commit order), and deletes its pending row; the CDC
// relay's polling half leaves such rows to it, and a polling Relay refuses
// to run there (its error wraps core.ErrConfig). To CDC: CreateCDC (it
// hands what is pending to the CDC relay's polling half), stop the polling
// Relays, start the CDC relays, switch the Writers to CDC, in a rolling
// deploy if you like. Back: switch the Writers back to polling (the CDC
// relays publish both kinds meanwhile), stop the CDC relays, DropCDC (it
// queues what the stream had not published), start the polling Relays.
//
// # Tables
//
// outbox_event is the log: every event, kept after publication for audit
// and replay until retention removes it. outbox_pending is the unpublished
// set, one narrow row per event; it plays the part of the partial index
// "WHERE published_at IS NULL" and is far cheaper to claim from and delete
// from than updating an indexed column of the log. outbox_lane holds one row
// per lane. See migrations/sql/001_outbox.up.sql.
package outbox
