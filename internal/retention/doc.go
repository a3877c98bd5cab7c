// Package retention removes what millrace keeps after it ended, from one
// schema: outbox events published or discarded, inbox dedup marks and
// processed inbox rows, a saga's barrier rows at a participant, ended sagas
// with their history and stored events, bulk operations, and old entries
// of the audit trail. The service runs a Cleaner
// (millrace.Config.Retention); a process of its own can run one too.
//
// What each window keeps, and why it must be long enough:
//
//   - Events: an event stays in the log for audit and replay until it was
//     published, or discarded by an operator, Events ago. An event that is
//     pending, dead-lettered or queued for replay is never removed,
//     whatever its age.
//   - Marks: a dedup mark (processed_event, of every consumer: the inbox,
//     the orchestrator's replies, the participants' commands) and a
//     processed inbox row stay Marks after they were processed. The window
//     must outlast the longest redelivery or replay horizon (broker
//     retention a consumer may rewind over, outbox replays, the longest
//     outage after which old messages are still delivered): a duplicate
//     that arrives after its mark was removed is applied again. An inbox
//     row not yet processed is never removed.
//   - Barrier: a participant is not told when a saga ends, so a saga's
//     barrier rows are taken as ended when none of them was written or
//     reached by a command (a duplicate, a late action, a failed
//     compensation) for Barrier, and are then removed together, never an
//     action's row without its compensation's. The window must outlast the
//     longest time after which a command of a saga can still arrive (the
//     saga's deadline plus the time an operator may take to retry it, and
//     the horizons above): a command that arrives after its saga's rows
//     were removed meets an empty barrier, so a duplicate action runs a
//     second time, a late action runs after its compensation (its effect
//     is then never undone), and a compensation of an action that ran is
//     taken for an empty one (the effect stays).
//   - Completed, Compensated: an ended saga is removed with its history,
//     stored events, keys and attributes once it ended Completed (completed
//     sagas) or Compensated (compensated sagas) ago; a saga that was ever
//     stuck stays until both its outcome's window and Compensated have
//     passed, and a child saga stays while its parent is there (the parent
//     may still compensate it). An event sent by key that no saga held
//     stays Compensated after it came. A saga
//     in any other status (running, compensating, stuck, paused,
//     scheduled, or one a later version adds) is never removed. A reply
//     for a removed saga is recorded as fenced for an unknown saga and
//     acknowledged; a Start with its id begins a new saga, so the windows
//     must outlast the time a start may be retried.
//   - Compensated also bounds bulk operations: one is removed, with its
//     record of each saga it selected, once it was created Compensated
//     ago; a request it filed that is applied later still applies, only its
//     outcome is no longer counted.
//   - Audit: an entry of the audit trail (an operator action, with who,
//     why and what) stays Audit after it was recorded, whatever became of
//     what it acted on: it is what someone asks about later.
//
// A pass removes each kind in small batches, each one short statement, so
// it never holds many locks nor bloats one transaction; the statements say
// which index each relies on. Batches skip rows another Cleaner (or a
// relay) holds, so several Cleaners (one per service instance) may run on
// one schema at once.
package retention
