// Package saga runs sagas: multi-step business transactions across
// services that always end, completed or compensated (or visibly stuck for
// an operator), with no workflow server. A saga's state lives in the
// service's own PostgreSQL; its commands leave through the outbox and its
// participants' replies come back through the inbox.
//
// # The model
//
// A saga type is a Definition: a name, an explicit version, a Go data type
// D (stored as jsonb) and steps, checked by Define. Each step has a name
// (its identity in the stored state and on the wire: never its position)
// and is
//
//   - remote: a Command (topic, command name, payload built from the data)
//     to a participant (package compensation), whose success reply may
//     update the data (OnSuccess, Reply), with an optional compensation
//     command; or
//   - local: a Go function the orchestrator runs in its own transaction,
//     under a savepoint (approve the order in the service that owns the
//     saga), with an optional local compensation; or
//   - a wait (Await): it waits for one external event, the first of
//     several, or all of a set, delivered with Signal, SignalTx,
//     SignalByKey (by a business key the saga holds) or EventHandler (a
//     payment provider's webhook, a person's approval); see "Waiting for
//     events" and "Correlation keys and search attributes"; or
//   - a child step (Child): it starts another saga of this service and
//     completes when that saga ends; see "Child sagas and conditional
//     steps".
//
// Any step but the pivot may have a condition (When): it runs only when
// the data says so, and is skipped otherwise.
//
// Each step has a Kind. Compensatable steps come first: when the saga
// fails, those that took effect (or may have: an action sent and never
// answered) are compensated in reverse order. At most one Pivot follows:
// the point of no return. Retriable steps come after it: they are retried
// by their RetryPolicy and never compensated. Define refuses, with an error
// wrapping core.ErrConfig, a compensatable step after the pivot, a
// second pivot, a retriable step before the pivot or without a retry
// policy, two steps with one name, a step with no command, and the like.
//
// Per step: Timeout (default 30s) for each attempt of a remote operation,
// OnTimeout (retry with a new attempt after a backoff, compensate, or park
// as stuck),
// Retry for the action (default 3 attempts, capped exponential backoff;
// RetryPolicy.Retryable says which failures retry) and CompensationRetry
// for the compensation (default 8 attempts). Per saga: a Deadline (default
// 24h, on unless negative), so no saga waits forever unnoticed.
//
// Adjacent steps with the same Step.Group form a parallel group: their
// commands go out together (local members run one after the other in the
// same transaction), and the saga moves on when every member succeeded. When
// a member fails, the members still in flight are waited for (their reply
// or their timeout; nothing is retried any more), then those that took
// effect, or may have, are compensated with the steps before, in reverse
// order. While a group runs, the saga's current step is the group's name;
// Retry, Skip and Abort apply to its unfinished members.
//
// # Running
//
//	def, err := saga.Define(saga.Spec[Order]{Type: "order", Version: 1, Steps: ...})
//	svc, err := millrace.New(pool, millrace.Config{Name: "orders", Brokers: brokers})
//	svc.Orchestrator().Register(def)
//	go svc.Run(ctx) // the replies, the timers, the relay, ...
//	...
//	saga.StartTx(ctx, tx, svc.Orchestrator(), def, orderID, Order{...}) // in the business transaction
//
// The service (millrace.Service) runs the orchestrator: RunBatched reads the
// reply topics and applies what their partitions have fetched many replies
// per transaction (one statement each for the dedup marks, the row locks,
// the states, the history and the commands), and Run fires the timers. A
// batch that fails is applied again one reply per transaction, so a reply
// that cannot be applied holds up no other. There is one way a reply is
// applied, HandleReplies, and a reply alone is a batch of one: for a
// Watermill Router of your own, AddToRouter adds Handler (a batch of one
// per message) behind PoisonQueue and Retry. An Orchestrator of its own
// (New) serves a process that only starts sagas or reads them, or records
// operator requests for the service's (Request).
//
// StartTx writes the saga row and its first command (through the outbox)
// in the caller's transaction: the order and its saga commit together. A
// second start with the same id and data returns the existing saga; with
// other data it fails with ErrAlreadyStarted.
//
// Each reply is applied in its batch's transaction: the inbox dedup mark,
// SELECT ... FOR NO KEY UPDATE on the saga row, fencing, the new state and history, and
// the next command or compensation through the outbox. Commands and
// replies are keyed by saga id, so one saga's messages stay in order. A row
// lock, not an optimistic version check: a reply, a timer and an operator
// action on one saga wait for each other and never burn a retry budget
// fighting. Run claims due sagas (next_wakeup_at <= now) with FOR NO KEY
// UPDATE SKIP LOCKED: any number of orchestrator processes share the replies and
// the timers. The timer pass claims only the sagas of the types and
// versions its orchestrator has registered: another service's sagas on
// the same schema, or a newer version's during a rolling deploy, are left
// to the orchestrator that has them.
//
// Each saga of a timer pass, and each operator request, is handled under
// a savepoint of its own. One that fails technically (a database error,
// a failing Hook) is rolled back alone and recorded ("timer_failed",
// "operator_failed" in its history) while the others commit; it is tried
// again after a backoff, and after Config.MaxTimerFailures failures in a
// row (5 by default, counted in the history, so across restarts) the saga
// is parked as stuck with the error (a request is dropped, as
// "operator_refused").
//
// Run probes the saga tables at start and fails at once when they are
// missing ("saga tables missing in schema ...: migrations applied?") or a
// privilege is; StartTx's error says the same.
//
// # States
//
//	StartTx ─── StartAt(later) ───► scheduled ── Abort ──► compensated (nothing ran)
//	   │                              │
//	   │      ◄──── start time due ───┘
//	   ▼
//	running ──────────── every step done ────────────────► completed
//	 │  ▲  │
//	 │  │  └─ failure, timeouts spent, deadline, Abort ──┐
//	 ▼  │ Retry, Skip                                     ▼
//	stuck (forward) ── Abort ───────────────────────► compensating ── all undone ──► compensated
//	                                                   │  ▲
//	                                                   ▼  │ Retry, MarkCompensated
//	                                                stuck (compensating)
//
//	running, compensating ── Pause ──► paused ── Resume ──► the status it paused from
//
// Going forward a saga is stuck when a retriable step spent its budget, a
// pivot that may have taken effect timed out, a step says TimeoutStuck, the
// deadline passed after the pivot or while the pivot has an unanswered
// attempt (running, or backing off after a timeout: it may have taken
// effect), a success reply could not be applied (it cannot be decoded, or
// it would put into the data what jsonb cannot store: a \u0000, a lone
// surrogate escape, a number out of numeric's range; ErrUnstorableData), a
// command could not be built or the outbox refuses it (a topic
// WriterConfig.ValidateTopic refuses), its timer failed technically
// Config.MaxTimerFailures times in a row or panicked, or its version is
// not registered (a scheduled saga too);
// compensating, when a compensation spent its budget, a command could not
// be sent, or the deadline passed.
//
// Failure reasons from participants and local steps may hold any bytes:
// a NUL is stored as U+FFFD in LastError, the step state and the history,
// so a reply is never refused by the database for its reason.
//
// A paused saga (Pause) takes no next step and fires no timer (its row has
// no wake-up); every operator action but Resume is refused. A reply that
// arrives meanwhile is stored with its inbox mark, in one transaction, and
// its message acknowledged, so the reply partition goes on for the other
// sagas on it (Handler and RunBatched alike); Resume applies the stored
// replies in the order they arrived, each once, in its own transaction.
// The deadline is suspended while paused: Resume pushes the saga's
// deadline and its current step's due time (the step's timeout, or its
// next try after a backoff) by the time it was paused, so a step paused
// with 10s left still has 10s after Resume; the "resumed" history line
// says by how much. Migrate moves a paused saga to a new definition
// version as it is (it stays paused: resume it on the new version).
//
// A scheduled saga (StartTx with StartAt) has its row, data and id at
// once and nothing else: its start time is its wake-up, so the first
// timer pass after it, of any orchestrator that has the definition
// registered, starts it (a restart in between changes nothing), and the
// Deadline counts from then. Abort cancels it: it ends compensated with a
// "cancelled" history line and never starts; no other action applies.
// Nothing of its definition runs then, no compensation either (no step
// took effect): rows the caller wrote with the start stay as written, so
// undo them where you call Abort. An event delivered to a paused or
// scheduled saga is stored, with a history line (outcome held) at once,
// and taken by Resume or by its wait once it has started.
//
// A wait step adds no saga status: the saga is running while it waits
// (step status waiting), and its timeout leads to compensating, stuck or
// the next step, as it declares (see "Waiting for events"). A saga is
// also stuck going forward when a wait says TimeoutStuck or its OnEvent
// failed with an error that is not a business failure.
//
// A child step adds no saga status either: the parent is running (step
// status running) while its child runs, and stuck while its child is
// stuck (see "Child sagas and conditional steps").
//
// A step is pending, running (waiting for a reply, or for its child saga),
// waiting (a wait step, for its events), backoff (waiting to
// retry), done, failed (a failure reply, or a child saga compensated: no
// effect), uncertain (given up after timeouts: it may have taken effect,
// so it is compensated), compensating, comp_backoff, compensated or
// skipped (by an operator, or by its condition) (StepState).
//
// # Guarantees
//
//   - Every saga reaches completed, compensated, or stuck with a reason in
//     LastError and its history: step timeouts, retry budgets and the
//     deadline bound every wait, and a failing compensation is retried
//     with backoff, never in a tight loop, then parked.
//   - A crash anywhere loses nothing: all state is in PostgreSQL and every
//     change commits with its inbox mark and its outgoing commands.
//   - A reply is applied at most once, and only if the saga waits for it:
//     a duplicate message is dropped by the inbox, and a reply for another
//     step or operation, for a step that no longer waits (a late reply
//     after the step was answered, a reply after the end), or for an
//     attempt never sent is recorded as "fenced" in the history and
//     ignored. A late reply of an earlier attempt of the operation the
//     step waits for is its answer (see below).
//   - A saga past its pivot never compensates; it retries forward or
//     parks as stuck.
//
// What does not hold: a participant sees a command at least once, and a
// timed-out action may run after all (the barrier of package compensation
// makes both safe: repeated attempts answer the first success, a late
// action after its compensation is cancelled). Local steps run at least
// once per try, in the orchestrator's transaction; their external side
// effects (an HTTP call) are not rolled back with it. Timers fire when Run
// polls (PollInterval, 1s by default) after they are due, not exactly on
// time. Metrics counters count what committed, but not across a crash
// between the commit and the count.
//
// # Retries and late replies
//
// When an attempt of a remote action times out and the policy allows
// another, the step backs off first (StepBackoff, for the Retry policy's
// capped exponential delay: MinBackoff, doubling per try, up to
// MaxBackoff), then sends the next attempt; the timeout is no sign that
// the participant did nothing, only that its answer is late, often queued
// behind other replies. A compensation that times out backs off likewise
// (CompensationRetry).
//
// Meanwhile, and after the next attempt went out, a success or
// cancellation replied to an earlier attempt is not fenced: it is the
// step's answer. This is sound because a participant's barrier (package
// compensation) keys its row by saga id, step and operation, never by
// attempt: the first attempt to reach it that takes effect stores its
// reply, and every attempt, earlier or later, is answered with it; a
// compensation that came first cancels the action for every attempt. So
// the late success of attempt 1 says what attempt 2's reply will say, and
// waiting for attempt 2 would only add a timeout. Once a reply is applied
// the step stops waiting and the other attempts' replies are fenced.
//
// A failure is different: it promises no effect, so it is not final. The
// barrier answers the failed attempt and earlier ones (sent again, or
// late) with the stored failure, but a later attempt runs the action
// again: a step that retries failures (a retriable step, or a
// RetryPolicy.Retryable that says so) gets a fresh try each time, and an
// operator's Retry of a step stuck on failures runs the action too. So an
// earlier attempt's failure is fenced while a later attempt is awaited
// (that attempt may still take effect); only the latest attempt's failure
// fails the step. For a compensation likewise: its success is final (it
// committed, and every later attempt answers success), its failure is not
// (each retry runs it again), so an earlier attempt's failure is fenced
// while a later attempt is awaited. Replies for another step or operation,
// for a step that no longer waits, and for an attempt higher than any sent
// (impossible from a real participant) stay fenced.
//
// A participant written without package compensation must keep the same
// contract: answer every attempt of one step's operation the same from the
// first success it committed (or the cancellation by the compensation),
// never run the action twice to effect, and answer a failed attempt and the
// earlier ones with that failure.
//
// # Waiting for events
//
// A wait step waits for events the world sends the saga, by name:
//
//	{Name: "payment_confirmed", Kind: saga.Compensatable, Await: &saga.Await[Order]{
//		Event:     "payment.confirmed",
//		OnEvent:   saga.EventFunc(func(o *Order, c Confirmation) error { o.PaymentRef = c.Ref; return nil }),
//		Timeout:   15 * time.Minute,
//		OnTimeout: saga.TimeoutCompensate,
//	}}
//
// Await.Any waits for the first of several events (the others are
// recorded and ignored when they come); Await.All for every one of a set,
// each applied as it arrives. OnEvent (or Await.On per name) applies an
// event's payload to the data; saga.Fail there fails the step. Await.Timeout
// (none by default: the saga's Deadline still applies) ends the wait with
// Await.OnTimeout: TimeoutCompensate (not after the pivot), TimeoutStuck,
// or TimeoutContinue, which goes on to the next step. A wait has no
// command, no retries and no remote compensation; before the pivot it may
// have a LocalCompensation, and it is never in a parallel group.
//
//	running ── reaches the wait ──► waiting ── the events arrived ──► next step
//	                                   │
//	                                   ├─ Timeout: TimeoutContinue ──► next step
//	                                   ├─ Timeout: TimeoutCompensate, or OnEvent fails ──► compensating
//	                                   └─ Timeout: TimeoutStuck ──► stuck (Retry waits again)
//
// Events are delivered in the caller's transaction with SignalTx (a
// webhook's HTTP handler: verify, SignalTx, commit, answer 200), in one of
// its own with Signal, or from a topic with EventHandler (a transaction
// per message; deduplicated by the event, not by an inbox mark).
// Each is stored in saga_event, whatever becomes of it, with its id: a
// second delivery with the same id applies nothing. An event that comes
// before the saga reaches its wait is stored (pending) and consumed when
// the saga gets there, in order of arrival; one after the wait is over is
// recorded and ignored (also one that comes after the wait's timeout or
// the saga's deadline before a timer pass fired it: the overdue timer
// fires first). A wait stuck on an event it could not apply keeps the
// other events it still needs for an operator's Retry, and an all-of wait
// that applied some of its events runs its LocalCompensation when the saga
// compensates from it. An event for a saga that has ended returns
// ErrSagaEnded, a name no step of the definition waits for
// ErrEventNotAwaited; both are stored as refused and recorded in the
// history. A saga that is stuck still stores its events for an
// operator's Retry.
//
// The signaller never waits for the orchestrator, and no event is missed:
// SignalTx takes the saga's row lock only if it is free (FOR NO KEY UPDATE
// SKIP LOCKED) and then applies the event at once, in its transaction; if
// the orchestrator holds the row (applying a reply, advancing the saga into
// its wait after it looked for stored events), the event is stored as new
// (under a key share lock, which keeps retention from removing the saga
// meanwhile) and the orchestrator's timer pass applies it, within a
// PollInterval. The history lines are "waiting" (a wait began) and
// "event", whose Outcome is consumed, pending, ignored or refused.
//
// # Child sagas and conditional steps
//
// A child step starts a saga of another definition, registered with the
// same orchestrator (Register registers it with its parent), and waits
// for its end:
//
//	{Name: "shipping", Kind: saga.Compensatable, Child: &saga.Child[Order]{
//		Definition: shippingDef,
//		Data:       func(o Order) (any, error) { return Parcel{Order: o.ID, Address: o.Address}, nil },
//		OnDone:     func(o *Order, child json.RawMessage) error { return json.Unmarshal(child, &o.Shipment) },
//	}}
//
// The child starts in the transaction that moves the parent to the step,
// with the id <parent>/<step>/<attempt> and Instance.Parent set: a crash
// before that commit starts no child, and a redelivered reply starts the
// same one, once. The child's end is told to the parent as an event
// (saga_event, with child set), which the parent applies as it applies a
// wait step's late events, on the timer pass (the committing process's Run
// at once; any other's within a PollInterval):
// completed moves the parent on (OnDone takes the child's data), compensated
// fails the step (the parent compensates, or retries with a new child
// under its RetryPolicy), stuck parks the parent as stuck with a reason
// naming the child; once an operator has the child end, its end moves the
// parent on. Compensating the parent compensates its child, the same way:
// an event asks the child (completed, or still running) to compensate its
// steps, and the child step is compensated when the child is. So the child
// of a compensatable step has no pivot (Define refuses one). A Retry of a
// parent whose child still runs or is stuck is refused: act on the child.
// ListParams.Parent lists a saga's children; the history lines are
// "child" (a child started, its id in Detail), child_completed,
// child_compensated and child_stuck. A child of another service is not
// started this way: a remote step's participant starts it.
//
// A step with When runs only if When(data) is true when the saga reaches
// it (it is not asked again for a retry):
//
//	{Name: "fraud_check", Kind: saga.Compensatable, When: func(o Order) bool { return o.Amount > 1000 }, Action: ...}
//
// Otherwise the step is skipped (StepSkipped), with a "skipped" history
// line whose Outcome is "condition" (an operator's skip has none), and,
// as it never ran, compensation passes over it. A condition that panics
// parks the saga as stuck at the step; Retry asks it again. The pivot
// cannot be conditional: skipped, it would let the steps after it, which
// never compensate, run past a point of no return never passed.
//
// # Correlation keys and search attributes
//
// The world rarely knows a saga's id: a payment provider's webhook knows
// its own payment id, a support engineer a customer. A definition declares
// correlation keys (Spec.Keys) and search attributes (Spec.Attributes),
// computed from the data:
//
//	Keys: []saga.Key[Order]{{Name: "payment_id", Unique: true, Value: func(o Order) string { return o.PaymentID }}},
//	Attributes: []saga.Attr[Order]{
//		{Name: "customer", Text: func(o Order) string { return o.Customer }},
//		{Name: "amount", Number: func(o Order) float64 { return o.Amount }},
//	},
//
// They are written to table saga_attr with the saga's state, in the same
// transaction: at the start (a scheduled start too) and whenever the data
// changes (a row whose value did not change is left as it is). A saga
// holds its keys while it has not ended (running, compensating, stuck,
// paused or scheduled). A unique key (Key.Unique) is held by one such
// saga of the type at a time: StartTx refuses a second with an error
// wrapping ErrKeyTaken, naming the holder, before it writes anything; a
// shared key may be held by many.
//
// SignalByKey and SignalByKeyTx deliver an event to the sagas of a type
// holding a key's value, each as SignalTx would (stored if early, applied
// once per event id, never waiting for the orchestrator; the stored event
// records the key it came by): to the one holder of a unique key, to every
// holder of a shared one. When none holds it, the event is stored as
// refused with an empty saga id and its key, and the error wraps
// ErrKeyNotHeld. EventHandler's route may address a message's event by key
// (EventTarget.Type, Key and Value).
//
// Keys and attributes filter List (ListParams.Attrs) and bulk queries
// (Query.Attrs): "customer=ada" (a key, a text, or a number or a time
// equal to it), "amount>100", "due<2026-01-31" (>, >=, <, <= on numbers and
// times), every filter holding; the millrace command (saga list --attr,
// the bulk selection's --attr) and the console's sagas filter take the
// same, so a bulk retry of "Ada's stuck orders" is one query. The filters
// are answered from saga_attr's indexes.
//
// # Versions
//
// A definition's Version is explicit, never a hash of the code. Each
// instance records the version it started on and finishes on it: register
// every version that still has live instances (old and new side by side),
// and start new sagas on the new one. Change the version whenever the
// steps change. A live saga whose version is not registered with the
// orchestrator a reply for it reaches is parked as stuck with that reason,
// logged as an error and counted (millrace_saga_unregistered_total); Run
// does this at start for every live or scheduled saga of a registered
// type (ParkUnregistered), marks paused ones with the reason (a reply for
// a paused one is held for Resume, as usual), and refuses the operator
// requests pending on them, which nothing would apply. The timer pass
// leaves such sagas alone. Register the version again and Retry the saga
// to resume it (a scheduled one starts then), or Migrate it.
//
// To move instances to a new version on purpose (every one that has not
// ended: paused and scheduled ones too), Migrate maps their
// step state (steps may be renamed only where an instance has not started
// them: a participant's barrier knows a step by its name; never two old
// steps to one new name) and upcasts their data, each under its row lock,
// with a "migrated" history line. An instance inside a parallel group
// moves if the group's members are exactly one group of the new version.
// An instance that cannot move faithfully stays on its version and is
// reported: its current step changes kind (a wait step that becomes a
// remote step, say), its current step would join a group whose other
// members would never start, or the new version has a step before the
// current one that has not run and never would.
//
// # Unsticking a saga
//
// List(ctx, ListParams{Status: StatusStuck}) finds stuck sagas; Get and
// History show why. Each action takes an Actor (who and why, both
// required, and from where), recorded in the history and in the audit
// trail (the audit_log table, in the action's transaction), and is
// checked against the saga's state (ErrActionNotAllowed, ErrNotFound,
// ErrNotRegistered). An Actor that says which revision of the saga the
// operator looked at (Actor.Revision) is refused as stale when the saga
// has changed since: nobody acts on a step they never saw.
//
//   - Retry: send the current operation again now, with a new attempt and
//     a fresh retry budget (fix the participant first). A step whose
//     success reply could not be applied is sent again too, in a parallel
//     group as outside one (StepState.Unapplied).
//   - Skip: going forward, treat the current step as done (its work was
//     done by hand) and move on. A remote step skipped after its action
//     was sent is still compensated if the saga later fails: the action
//     may have run.
//   - MarkCompensated: compensating, treat the current step as undone by
//     hand and continue with the steps before it.
//   - Abort: going forward before the pivot, stop and compensate; a
//     scheduled saga is cancelled.
//   - Pause and Resume: hold a running or compensating saga where it is,
//     and let it go on (see States).
//
// No timer fires for a stuck saga, so its deadline may pass while it
// waits. An action that leaves a saga past its deadline running or
// compensating moves the deadline to the definition's Deadline from now
// (none if the definition has none), with a "deadline_moved" history line
// naming the operator, the reason and both deadlines: the next timer pass
// does not turn the action into the deadline's compensation or parking.
//
// Those act at once and need the saga's definition. A tool without the
// definitions (the stock millrace command, a standalone console) records
// an operator request instead: Operator (NewOperator; Retry, Skip,
// MarkCompensated, Abort, Pause, Resume, Request, RequestTx) checks the
// action against the saga's status and phase as the orchestrator does,
// stores it on the saga
// (Instance.Request; one at a time, else ErrRequestPending) with an
// "operator_request" history line, and the service's orchestrator applies
// it on its next timer pass (Run, RunDue) through the same code as Retry
// and friends, recorded as the requester. A request records the saga's
// step and revision (Request.Step, Request.Revision); one the saga's state
// no longer allows by then, or stale (the saga changed since: another
// step, or the same step after a reply, a timer or another action), is
// recorded as "operator_refused" and dropped, never applied to a state the
// operator did not see; a pause request alone applies whatever step the
// saga has moved on to, as long as it is still running or compensating (a
// busy saga would otherwise never hold still for it). Saving a saga (a reply, a timer) never clears a
// pending request; only applying, refusing or withdrawing it does
// (Operator.Withdraw, with an "operator_withdrawn" history line). Only an
// orchestrator with the saga's type and version registered applies it.
//
// An operator can also send a saga the event its sender failed to send
// (a lost webhook): Orchestrator.Signal, by saga id or by key, applies it
// as SignalTx does and records the operator in the history and the audit
// trail; it is refused with Signal's errors (and as stale, with
// Actor.Revision). Without the saga's definition it stores the event for
// the service's orchestrator, whose next pass applies it.
//
// # Bulk actions
//
// After an incident, many sagas need the same action. A Query selects
// them by type, status, current step, age, a LIKE match on the last
// error and attributes (Query.Attrs); Orchestrator.DryRun counts them and lists the newest, changing
// nothing. Orchestrator.Plan records a bulk operation (who planned it,
// why, the action, the query, and each selected saga with its revision)
// and Orchestrator.Apply confirms it: it files an ordinary operator
// request on each saga, 500 per transaction, in the name of the one who
// confirms, on behalf of the planner when that is someone else
// (Request.OnBehalfOf), naming the operation (Request.Operation, and in
// each history line's detail); Bulk does both. Each saga is checked at
// filing under its row lock: one that changed since it was selected,
// whose state refuses the action, or that has another request pending is
// refused and counted, not acted on.
// The running orchestrator applies the filed requests as any other
// (checking each again) and records each outcome on the operation;
// Orchestrator.BulkStatus reads the counts (BulkCounts: unfiled, filed,
// pending, applied, refused by reason) by operation id at any time. Any
// Action works in bulk.
//
// # Retention
//
// The service runs retention (millrace.Config.Retention), which removes
// ended sagas with their history and stored events once their window has
// passed since they ended: Completed for completed ones (7 days by
// default), Compensated for compensated ones (30 days by default), and,
// for a saga that was ever stuck, Compensated too when that is longer. It
// never removes a saga in any other status: running, compensating, stuck,
// paused, scheduled, or a status it does not know. It works oldest first
// in batches of 500 sagas, each batch one short statement that skips rows
// another instance's retention holds, and removes bulk operations, with
// their record of each saga, once they were made Compensated ago. After a
// saga is removed, a late reply for it is recorded as fenced for an
// unknown saga, and Start with its id starts a new saga: keep the windows
// longer than any start may be retried.
//
// A saga's history stays bounded by its steps and attempts, not by the
// replies that reach it: a run of identical fenced replies (the same step,
// operation, attempt, outcome and reason, e.g. a participant redelivering
// a reply to a finished step) is one history entry whose Detail counts
// them: {"count": n, "last_at": ...}.
//
// # Tables and hooks
//
// Migration 005_saga creates saga_instance (one row per saga; indexes for
// due timers, pending operator requests, and listing by type, status and
// age) and saga_history; 007_saga_retention adds retention's index on
// ended sagas; 009_saga_events creates saga_event, the events delivered
// to sagas (retention removes them with their saga); 010_saga_pause
// adds the paused and scheduled statuses, saga_pause and the held
// replies (saga_held_reply); 011_saga_bulk adds the bulk operations
// (saga_bulk_operation, saga_bulk_item) and an index selecting sagas by
// status and step; 012_saga_history_stuck indexes the history's stuck
// lines for retention; 014_saga_attr adds the keys and attributes
// (saga_attr), the key an event came by (saga_event.key_*),
// saga_instance.parent (a child saga's parent, indexed) and
// saga_event.child (an event between a parent and its child).
// docs/tables.md lists every column a user can
// query.
// Config.Clock replaces the real time (for tests that skip time) and
// Config.Hook is called at each persistence boundary (the row loaded,
// before the commit, after it), for the sagatest harness to inject crashes;
// unset, both cost nothing.
package saga
