// Package sagatest tests sagas against faults, fast and deterministically:
// a user's real saga definitions and real participant functions, on a real
// PostgreSQL schema, with duplicated, lost, late and reordered messages,
// failing participants and a crashing orchestrator, and no test waiting on
// a wall-clock timeout.
//
// # The harness
//
// New(t, Config) makes a fresh migrated schema (dropped when the test ends),
// an orchestrator on it with a Clock of the harness's own, and starts the
// real outbox relay, which publishes to an in-process transport the harness
// controls: every command and reply takes the real path, outbox write →
// relay → inbox dedup → handler, but the harness decides what is delivered
// when, one message at a time, synchronously.
//
//	func TestOrderSaga(t *testing.T) {
//		h := sagatest.New(t, sagatest.Config{
//			Faults:  sagatest.Script(sagatest.Drop.On(sagatest.Event{Kind: sagatest.Reply, Step: "stock"})),
//			Effects: myEffects, // what the participants' tables say was applied
//		})
//		p, _ := h.NewParticipant("payments") // a compensation.Participant on h's schema
//		compensation.Register(p, "credit", reserve, release)
//		h.AddParticipant(p, "credit")         // its command topic (errors unchecked here)
//		h.Register(orderDef)
//		saga.Start(ctx, h.Orchestrator(), orderDef, "order-1", Order{...})
//		h.Run(t) // every message, every timer, the faults, then the invariants
//		in, _ := h.Get("order-1")             // assert on the end state, history, tables
//	}
//
// Run delivers the queued messages in order. When none is left it collects
// what the relay published meanwhile (a wave, ordered by saga then outbox
// order, so that the schedule never depends on the relay's speed); when
// nothing is published either, it moves the Clock to the earliest due timer
// of any saga and fires the due timers (Orchestrator.RunDue): a one-hour
// timeout costs no time. It stops when no saga has a timer and nothing is
// queued, then checks the invariants and fails t with the trace if one does
// not hold. RunE returns the Report instead.
//
// Participants built with package compensation are wired with
// AddParticipant (behind their inbox dedup middleware, as their
// AddToRouter does); any other handler with AddHandler. Each subscriber
// gets its own copy of a message, as a Kafka consumer group would. A
// message on a topic nobody subscribed to is kept aside (Unrouted). Give
// participants h.Writer() (NewParticipant does): its every transaction
// wakes the relay, where another Writer may leave it to its poll.
//
// Replies go to the orchestrator's Handler one by one, or, with
// Config.BatchReplies, those queued together in one HandleReplies call:
// the batched path of RunBatched, under the same faults.
//
// # The database
//
// The harness runs on the PostgreSQL named by the environment variable
// DATABASE_URL (a pgx connection string; when unset,
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable). Each New,
// Open and each worker of Explore creates a schema of its own with a
// random name, applies millrace's migrations to it, and drops it at the
// end (t.Cleanup, or Close), so tests may run in parallel on one
// database. The role needs to create schemas. The harness's connections
// commit with synchronous_commit off (see Limits).
//
// # Table names
//
// A participant's and a local step's SQL must name the tables of the
// harness it runs in: h.Schema(), or h.Table("name") for a quoted,
// qualified name. Hand the names to the code that builds the participant
// functions (a constructor argument, a struct field) rather than setting
// a package variable from the test: Explore runs several harnesses at once
// (Workers), each on its own schema, and a package variable would point
// them all at one.
//
//	type payments struct{ account string } // a qualified table name
//
//	func (p payments) reserve(ctx context.Context, tx pgx.Tx, call compensation.Call, c Credit) (struct{}, error) {
//		_, err := tx.Exec(ctx, `UPDATE `+p.account+` SET available = available - $2 WHERE customer = $1`, c.Customer, c.Amount)
//		return struct{}{}, err
//	}
//
//	// In the Scenario, per harness:
//	pay := payments{account: h.Table("account")}
//	compensation.Register(p, "credit", pay.reserve, pay.release)
//
// In production the same constructor takes the service's own names (or
// pgx.Identifier{"account"}.Sanitize() with the service's search_path).
//
// # Faults
//
// A fault names the event it hits with an Event: a Command delivered to a
// participant, a Reply delivered to the orchestrator, a Timer firing for a
// saga, or another Message; its zero fields match anything, and Seq picks
// the n-th occurrence. The kinds:
//
//   - Duplicate: deliver now and again later (same message id: the inbox
//     must drop it).
//   - Drop: lose the message; the step's timeout must recover.
//   - Delay (DelayFor): hold the message for Times timer firings (1 by
//     default), past its step's timeout, then deliver it after what those
//     timers sent (a late reply of an unanswered attempt is the step's
//     answer and the replies after it are fenced, a late action after its
//     compensation cancelled).
//   - Reorder: deliver the next queued message of another saga first.
//   - Error (FailTimes): the participant's handler fails N times in a row
//     with a technical error after its function ran, so its transaction
//     rolls back; then it succeeds.
//   - Crash (CrashAt): the orchestrator fails at a hook point
//     (CrashLoaded: reply read, nothing written; CrashBeforeCommit;
//     CrashAfterCommit) while it handles a reply or fires a timer. The
//     harness starts a new orchestrator, as a new process would, and
//     redelivers the unacknowledged reply.
//   - Pause (PauseFor): an operator pauses the event's saga just before
//     the event (saga.Orchestrator.Pause), and resumes it after N timer
//     firings or once nothing else can move: a reply meanwhile is held
//     and applied on resume. Not in AllFaults (older seeds replay as
//     before): name it in a Script or in RandomOptions.Kinds.
//
// Script(faults...) injects exactly these, each once. Random(seed, opts)
// draws them: the same seed on the same scenario injects the same faults at
// the same events, and a Report lists the faults injected with the exact
// events they hit, so Script(report.Faults...) replays a run.
//
// # Invariants
//
// After every run the harness checks every saga of the schema:
//
//   - it ended: completed, compensated, or stuck with a reason, and its
//     row agrees (end time, no current step, no timer);
//   - no reply was applied twice, none without the command it answers, and
//     no operation's success was applied twice;
//   - every participant effect matches its step's end state: a step done
//     has its effect exactly once; a step pending, failed, compensated or
//     skipped by its condition (Step.When) has none; no step has it twice.
//     The effects are read from the
//     compensation barrier (for participants of package compensation) and
//     from Config.Effects, which reads the participants' own tables;
//   - the history agrees with the state: it starts with "started", its
//     last status and its last end event are the saga's, every step done
//     or compensated has its step event, command attempts only grow;
//   - no stored event was left unapplied, no wait step consumed two
//     events of one name, and no child step took two ends of its child
//     (Step.Child) with the same status;
//   - no message was poisoned, none is left undelivered;
//   - Config.Check, the user's own, holds.
//
// # Exploration
//
// Explore(t, ExploreConfig, scenario) runs a Scenario (a function that
// registers participants and definitions and starts sagas on a harness)
// many times: with Enumerate, once without faults and then once per event
// of that run and kind of fault that applies to it (a crash at each of the
// three hook points); then Runs times with Random faults from Seed, Seed+1,
// and so on. Runs go on Workers schemas at once; each run starts on an
// emptied schema (every table but millrace's fixed rows), so a scenario
// creates its tables with CREATE TABLE IF NOT EXISTS in h.Schema(). On the
// first failing run it shrinks the faults, dropping them one at a time
// (and lowering the Times of Error and Delay faults) while the run still
// fails, and fails t with the smallest fault list found, the Script that
// replays it, the seed and the trace; SAGATEST_SEED=<seed> in the
// environment repeats an exploration whose Seed is unset. FindFailure
// returns the Failure instead.
//
// # Limits
//
// The harness runs one orchestrator at a time and delivers one message at
// a time: it explores the orders of deliveries, timers and crashes, not the
// races between two orchestrator processes on one row (the row lock
// decides those; package saga tests them with real concurrency). Time
// moves only between waves, to the next due timer (a timer pass also
// runs, without moving time, when stored events wait for one: a child
// saga's end told to its parent). Its connections commit
// without waiting for the disk (synchronous_commit off): a test does not
// survive the machine's crash anyway. Participants' tables belong in
// h.Schema(); Explore empties them between runs.
package sagatest
