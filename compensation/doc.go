// Package compensation is the participant side of sagas: the services that
// receive a saga's commands (reserve credit, reserve stock) and their
// compensations (release them). A participant is two ordinary Go functions
// per command, an action and its compensation, that run in the handler's
// PostgreSQL transaction; the package puts a barrier in front of them and
// sends the reply through the outbox in the same transaction.
//
// # Writing a participant
//
// A participant is added to the service that runs it (millrace.Service),
// with the command topic it reads; its commands are registered on it
// before the service runs:
//
//	p, _ := svc.AddParticipant("payments", "payments.commands")
//	compensation.Register(p, "reserve_credit",
//		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) (Reserved, error) {
//			ok, err := debit(ctx, tx, cmd.Account, cmd.Amount)
//			if err != nil {
//				return Reserved{}, err // technical: rolled back, retried, no reply
//			}
//			if !ok {
//				return Reserved{}, compensation.Fail("insufficient credit") // replied, no effect
//			}
//			return Reserved{Amount: cmd.Amount}, nil // replied as JSON
//		},
//		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd ReserveCredit) error {
//			return credit(ctx, tx, cmd.Account, cmd.Amount) // the semantic undo
//		})
//
// The service reads the topic with RunBatched: it takes what the topic's
// partitions have fetched and handles it many commands per transaction,
// with the batch's inbox dedup marks (consumer: the participant's name),
// the barrier rows, the functions' effects and the replies (HandleTx).
// Several commands may share a topic: a command is routed on its name. A
// participant owns its command topics: a command it has not registered is
// poisoned, not skipped.
//
// There is one way a command is applied, HandleTx, and a command alone is
// a batch of one. For a Watermill Router of your own, AddToRouter adds
// Handle (a batch of one in a transaction of its own, with its dedup mark)
// behind PoisonQueue and Retry; HandleTx runs commands in a transaction
// you own (an inbox.Processor's, for one).
//
// # The wire protocol
//
// Commands and replies are Watermill messages (Kafka records) with the
// metadata (Kafka headers) of package core, so that a participant or an
// orchestrator in another language can take part by reading headers;
// docs/protocol.md specifies it, with test vectors (TestVectors runs them).
// A command of a protocol version this participant does not speak is
// answered "failure" (its reason starts "unsupported saga_protocol") and writes no barrier row.
//
// A command, on the participant's command topic, carries:
//
//	saga_protocol     MetadataSagaProtocol    the protocol version, "1" (absent: 1)
//	saga_id           MetadataSagaID          the saga instance (at most 200 bytes of UTF-8, no NUL)
//	saga_type         MetadataSagaType        the saga type's name (may be empty)
//	saga_step         MetadataSagaStep        the step's name, never its position
//	saga_attempt      MetadataSagaAttempt     1, 2, ... in decimal; every attempt is a new message
//	saga_operation    MetadataSagaOperation   "action" or "compensation"
//	saga_command      MetadataSagaCommand     the command's name, the same for its compensation
//	saga_reply_topic  MetadataSagaReplyTopic  where the reply goes
//	event_id                                  its dedup id (a UUID; set by the outbox relay)
//	partition_key                             the saga id, so one saga's messages keep their order
//
// and its payload is the command as JSON. A compensation command carries
// the action's command name and payload, with operation "compensation".
//
// The reply, on the command's reply topic, keyed by the saga id, copies
// saga_id, saga_type, saga_step, saga_attempt (the command's attempt, even
// when the answer is a stored one), saga_operation and saga_command, and
// adds:
//
//	saga_outcome   MetadataSagaOutcome   "success", "failure" or "cancelled"
//	saga_reason    MetadataSagaReason    why, for "failure" and "cancelled"
//	saga_protocol  MetadataSagaProtocol  "1"
//
// Its payload is the action's reply as JSON for a successful action, "{}"
// otherwise. Its event type is "saga.reply". The outbox stores payloads as
// jsonb, so the reply's JSON may come back re-spaced and with keys
// reordered; it is the same JSON value on every attempt.
//
// Call.IdempotencyKey is the same for every attempt of a step's operation:
// the UUIDv5 of saga id, step and operation (see IdempotencyKey). Pass it to
// external APIs, a payment provider say, whose side effects no database
// transaction can roll back.
//
// # The barrier
//
// The inbox stops the same message from applying twice. It does not stop
// what sagas do to participants: a retried command is a new message, and a
// compensation can overtake its action. The barrier is a table,
// compensation_barrier, keyed by (saga id, step, operation) and written in
// the handler's transaction, so a row exists exactly when its effects
// committed. It handles three cases.
//
// Duplicate action. The orchestrator times out and sends attempt 2; the
// action must not run twice and must answer as it did the first time (a
// business failure excepted: see Failures):
//
//	orchestrator                 participant
//	action #1  ───────────────►  claims (S, step, action); runs the action;
//	(timeout)                    stores outcome and reply; replies ──► (late)
//	action #2  ───────────────►  finds the row: replies the stored answer,
//	                             the function does not run
//
// Empty compensation. The compensation arrives for an action that never
// ran (lost, or still in flight); it succeeds with no effect and is
// remembered:
//
//	action #1  ──► (lost or delayed)
//	compensation ─────────────►  claims (S, step, compensation), also writes
//	                             (S, step, action) as "cancelled": no action
//	                             ran, nothing to undo; replies success
//
// Late action (hanging). The action arrives after its compensation; it
// must not run, or its effect would never be undone:
//
//	compensation ─────────────►  (as above: the action's row is "cancelled")
//	action #1 (late) ─────────►  finds its row cancelled: replies
//	                             "cancelled", the function does not run
//
// The barrier knows a step by saga id and step name only: saga ids must be
// unique among all the orchestrators whose commands reach one participant's
// schema (the saga package keys its instances by id; two services choosing
// ids such as "order-42" for different sagas should prefix them, or use
// UUIDs), or one saga's command would be answered with another's reply.
//
// An action and its compensation that arrive at the same moment on two
// consumers are ordered by the action's row: both write it (INSERT ... ON
// CONFLICT on the primary key), so the second waits for the first
// transaction to end and then sees what it decided. A compensation locks its
// own row before the action's, so two attempts of one compensation never
// deadlock. A compensation delivered twice runs once; a compensation of an
// action that failed (a business failure, no effect) is empty too, and
// cancels the action's row.
//
// # Failures
//
// Return compensation.Fail(reason) for a business failure. From an action,
// it rolls back what the action wrote (a savepoint), records the failure
// and its attempt in the barrier and replies "failure" with the reason. A
// failure promises no effect, so it is not final: that attempt and earlier
// ones, delivered again or late, get the stored failure, and a later
// attempt (the orchestrator retrying the step, or an operator's Retry)
// claims the row again and runs the action, so a retried step can succeed.
// A compensation that finds the failure turns the action's row into
// cancelled, so no attempt runs the action after its compensation (the
// late-action rule above). From a compensation, it also rolls back and
// replies "failure", but it is not final: the orchestrator retries the
// compensation with backoff and parks the saga stuck when its budget is
// spent; each retry runs the compensation again. Any other error is
// technical: the whole transaction rolls back (dedup mark, barrier, effects),
// nothing is replied, and the message is retried by Retry and redelivery.
// A command that cannot be understood or answered (bad metadata, an
// unknown command, a payload that does not decode, a reply topic the
// participant's outbox Writer refuses) fails with a core.Permanent error
// wrapping ErrInvalidCommand or ErrUnknownCommand, and goes to the poison
// topic with the reason. One that can be answered, as its saga headers and
// reply topic are usable (an unknown command, a payload that does not
// decode), is also answered by RunBatched and Handle, in the transaction
// of its inbox mark: a failure whose reason begins "poisoned: " (nothing
// ran), so the saga records why its step failed at once; for an action,
// that failure is the attempt's in the barrier, so the same attempt
// requeued from the poison topic later never runs (docs/protocol.md,
// "Malformed input"). Nothing else is written.
//
// # Writing a compensation
//
// A compensation is a semantic undo, not a rollback: the action committed
// and others may have seen and used its effect. Release the reservation,
// refund the payment, put the stock back; where the effect cannot be
// removed, record a counter-entry. Call.ActionReply holds what the action
// replied (a reservation id, say). The barrier guarantees the compensation
// runs only if the action ran and succeeded, and at most once successfully,
// so it need not guard against delivery; it must still be idempotent toward
// external systems, through Call.IdempotencyKey.
//
// What a participant must not do:
//
//   - publish to the broker directly, or call another service and wait: its
//     messages go through the outbox in the same transaction (the reply does
//     so already);
//   - keep effects outside the transaction (files, caches, HTTP calls
//     without an idempotency key): a retried or crashed attempt repeats them;
//   - commit or roll back the transaction it is given, or swallow a
//     technical error as a business failure (the effect would be recorded
//     as a final answer).
//
// # Performance
//
// A batch costs its BEGIN with the batch's dedup marks and the barrier's
// claims (with a savepoint) in one round trip, the functions' own
// statements (the savepoint between two functions goes in the round trip
// of the next one's first statement), and the barrier's answers with the
// replies and the COMMIT in one round trip: a command alone whose function
// sends one statement costs three round trips, a batch of a hundred not
// many more. The README's Performance section has the figures of the
// bench, which runs participants as a service runs them.
//
// # Retention
//
// The service runs retention (millrace.Config.Retention), which removes
// the barrier rows of sagas that ended; since a participant is not told
// when a saga ends, it takes a saga as ended when no command of it arrived
// for its Barrier window (7 days by default), and removes a saga's rows
// together. The window must outlast the longest time after which a command
// of a saga can still arrive: the saga's deadline plus the time an
// operator may take to retry a stuck saga, the broker's retention if
// consumers may rewind, outbox replays, the longest outage after which old
// messages are still delivered. A command that arrives after its saga's
// rows were removed meets an empty barrier: a duplicate action runs a
// second time, a late action runs after its compensation (its effect is
// then never undone), and a compensation of an action that ran is taken
// for an empty one (the effect stays).
//
// # Metrics
//
// With Config.Metrics (a prometheus.Registerer; a Service passes its own,
// labelled with its name) a participant counts, all prefixed
// millrace_compensation_:
//
//	actions_total               action functions run (whatever their outcome)
//	compensations_total         compensations run against an action's effect
//	empty_compensations_total   compensations that found no action to undo
//	late_actions_total          actions that arrived after their compensation
//	business_failures_total     business failures returned (label operation)
//	duplicates_total            repeated commands answered from the barrier (label operation)
//	poisoned_total              commands sent to the poison topic (label participant only)
//	batch_size                  commands a RunBatched transaction takes (histogram)
//
// by participant and command. A
// poisoned command is also logged at error level with its reason
// (Config.Logger, slog.Default() unless set); "millrace poison list" and
// the console's poison-topic page show a poison topic, and requeue its
// messages.
//
// # Tables
//
// Migration 004_compensation (package migrations) creates
// compensation_barrier in millrace's schema, and 006_barrier_attempt adds
// the attempt that wrote each row's outcome; the participant also uses the
// outbox (001) and the inbox's processed_event (002).
package compensation
