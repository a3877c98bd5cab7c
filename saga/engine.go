package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/backoff"
	"github.com/millrace/millrace/outbox"
)

// machine applies one event (a start, a reply, a timer, an operator action)
// to one saga locked in tx, and collects what to write: the new state, its
// history, the commands to send.
type machine struct {
	o   *Orchestrator
	d   *def
	in  *Instance
	ctx context.Context
	tx  pgx.Tx
	now time.Time

	events []outbox.Event
	hist   []historyRow
	after  []func() // metrics, once committed
	// fenced is set when a reply changed nothing but the history;
	// applied when one changed the saga.
	fenced, applied bool
	// held is set when a reply to a paused saga was stored for Resume.
	held bool
}

// technicalError is a failure of the transaction itself (not of a step):
// the whole event is rolled back and retried.
type technicalError struct{ err error }

func (e technicalError) Error() string { return e.err.Error() }
func (e technicalError) Unwrap() error { return e.err }

func (m *machine) record(event, step, op string, attempt int, outcome, reason string) {
	m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: event, step: step, op: op,
		attempt: attempt, outcome: outcome, status: string(m.in.Status), reason: reason})
}

func (m *machine) pastPivot() bool {
	if m.d.pivot < 0 {
		return false
	}
	st := m.in.Steps[m.d.steps[m.d.pivot].name]
	return st != nil && (st.Status == StepDone || st.Status == StepSkipped)
}

func (m *machine) due(d time.Duration) *time.Time {
	t := m.now.Add(d)
	return &t
}

// command queues a step's command (action or compensation) at attempt.
func (m *machine) command(s *stepDef, c *command, op string, attempt int) error {
	payload, err := c.payload(m.in.Data)
	if err != nil {
		// A bug in the definition's payload function, or data it cannot
		// handle: no command goes out, and an operator decides.
		return m.stuck(fmt.Sprintf("step %s: build the %s command: %v", s.name, op, err))
	}
	md := map[string]string{
		core.MetadataSagaID:         m.in.ID,
		core.MetadataSagaType:       m.d.typ,
		core.MetadataSagaStep:       s.name,
		core.MetadataSagaAttempt:    strconv.Itoa(attempt),
		core.MetadataSagaOperation:  op,
		core.MetadataSagaCommand:    c.name,
		core.MetadataSagaReplyTopic: m.d.replyTopic,
		core.MetadataPartitionKey:   m.in.ID,
		core.MetadataSagaProtocol:   core.SagaProtocolVersion,
	}
	traceCommand(m.ctx, md) // tracing.go
	ev := outbox.Event{
		Topic:         c.topic,
		PartitionKey:  m.in.ID,
		AggregateType: "saga:" + m.d.typ,
		AggregateID:   m.in.ID,
		EventType:     c.name,
		Payload:       payload,
		Metadata:      md,
	}
	if err := m.o.writer.Validate(ev); err != nil {
		// The outbox refuses it (a topic WriterConfig.ValidateTopic
		// refuses, say): it would be refused on every try, so, as for a
		// payload that cannot be built, an operator decides.
		return m.stuck(fmt.Sprintf("step %s: the outbox refuses the %s command: %v", s.name, op, err))
	}
	m.events = append(m.events, ev)
	m.in.Attempts = attempt
	m.record("command", s.name, op, attempt, "", "")
	// Where the command went, for tools without the definition (the
	// console shows when its partition is not consumed).
	m.hist[len(m.hist)-1].detail, _ = json.Marshal(commandDetail{Topic: c.topic, Command: c.name})
	return nil
}

// commandDetail is the detail of a "command" history line.
type commandDetail struct {
	Topic   string `json:"topic"`
	Command string `json:"command,omitempty"`
}

// runLocal runs fn under a savepoint. stepErr is fn's failure (its writes
// are rolled back); err is a failure of the transaction itself.
func (m *machine) runLocal(fn func(context.Context, pgx.Tx, []byte) ([]byte, error)) (stepErr, err error) {
	sp, err := m.tx.Begin(m.ctx)
	if err != nil {
		return nil, technicalError{fmt.Errorf("saga %s: savepoint: %w", m.in.ID, err)}
	}
	data, ferr := fn(m.ctx, sp, m.in.Data)
	if ferr == nil {
		if serr := checkStorable(data); serr != nil {
			ferr = core.Permanent(serr)
		}
	}
	if ferr != nil {
		if rerr := sp.Rollback(m.ctx); rerr != nil {
			return nil, technicalError{fmt.Errorf("saga %s: rollback to savepoint after %v: %w", m.in.ID, ferr, rerr)}
		}
		return ferr, nil
	}
	if err := sp.Commit(m.ctx); err != nil {
		return nil, technicalError{fmt.Errorf("saga %s: release savepoint: %w", m.in.ID, err)}
	}
	m.in.Data = data
	return nil, nil
}

// advance runs the saga forward from step i.
func (m *machine) advance(i int) error {
	m.in.Status, m.in.Phase = StatusRunning, PhaseForward
	for i < len(m.d.steps) {
		s := m.d.steps[i]
		if s.group != "" {
			return m.startGroup(s.group)
		}
		m.in.Step = s.name
		done, err := m.tryIf(s) // when.go
		if err != nil || !done {
			return err
		}
		i++
	}
	return m.end(StatusCompleted, "")
}

// try runs one try of s's action: a remote step's command is sent (done is
// false: it waits for the reply), a local step's function runs (done when
// it succeeded; a failure goes to actionFailed).
func (m *machine) try(s *stepDef) (done bool, err error) {
	st := m.in.state(s.name)
	if st.StartedAt == nil {
		st.StartedAt = &m.now
	}
	if s.wait != nil {
		return m.enterWait(s, st) // await.go
	}
	st.Tries++
	st.Attempt++
	if s.child != nil {
		st.Status, st.Due = StepRunning, nil
		m.in.Attempts = st.Attempt
		return false, m.startChild(s, st) // child.go
	}
	if s.remote {
		if st.AwaitFrom == 0 {
			st.AwaitFrom = st.Attempt // else earlier attempts are still unanswered
		}
		st.Status, st.Due = StepRunning, m.due(s.timeout)
		return false, m.command(s, s.action, core.OperationAction, st.Attempt)
	}
	m.in.Attempts = st.Attempt
	stepErr, err := m.runLocal(s.local)
	if err != nil {
		return false, err
	}
	if stepErr != nil {
		m.record("failed", s.name, core.OperationAction, st.Attempt, "", stepErr.Error())
		return false, m.actionFailed(s, st, stepErr)
	}
	m.stepDone(s, st, st.Attempt)
	return true, nil
}

// retry tries s's action again, now.
func (m *machine) retry(s *stepDef) error {
	if s.group == "" {
		return m.advance(m.d.index[s.name])
	}
	done, err := m.try(s)
	if err != nil || !done {
		return err
	}
	return m.settleGroup(s.group)
}

// startGroup starts every member of a parallel group.
func (m *machine) startGroup(g string) error {
	r := m.d.groups[g]
	m.in.Step = g
	for i := r[0]; i < r[1]; i++ {
		if _, err := m.tryIf(m.d.steps[i]); err != nil { // when.go
			return err
		}
		if m.in.Step != g || m.in.Status != StatusRunning || m.groupFailing(g) {
			break // a member failed (or the saga is stuck): start no more
		}
	}
	if m.in.Step != g || m.in.Status != StatusRunning {
		return nil
	}
	return m.settleGroup(g)
}

// groupFailing reports whether a member of group g has failed.
func (m *machine) groupFailing(g string) bool {
	r := m.d.groups[g]
	for i := r[0]; i < r[1]; i++ {
		if st := m.in.Steps[m.d.steps[i].name]; st != nil && (st.Status == StepFailed || st.Status == StepUncertain) {
			return true
		}
	}
	return false
}

// settleGroup moves on once group g has settled: every member done (or
// skipped): the next step; a member failed and none is in flight any more:
// compensation (stuck for a retriable group). Members waiting to retry are
// not retried once another member failed.
func (m *machine) settleGroup(g string) error {
	r := m.d.groups[g]
	failing := m.groupFailing(g)
	inFlight, allDone := false, true
	for i := r[0]; i < r[1]; i++ {
		st := m.in.state(m.d.steps[i].name)
		switch st.Status {
		case StepDone, StepSkipped:
		case StepRunning:
			inFlight, allDone = true, false
		case StepBackoff:
			allDone = false
			if failing {
				st.Status, st.Due = StepFailed, nil // its last try had no effect
				if st.AwaitFrom > 0 {
					st.Status = StepUncertain // or it timed out: it may have
				}
			} else {
				inFlight = true
			}
		default:
			allDone = false
		}
	}
	m.in.Step = g
	switch {
	case inFlight:
		return nil
	case allDone:
		return m.advance(r[1])
	}
	reason := m.in.LastError
	if reason == "" {
		reason = "group " + g + " failed"
	}
	if m.d.steps[r[0]].kind == Retriable {
		return m.stuck(reason)
	}
	m.in.Step = m.d.steps[r[1]-1].name
	return m.compensate(reason)
}

// stepDone marks s done by the answer to attempt (an earlier one than
// st.Attempt when a late reply completed it), as its history line says.
func (m *machine) stepDone(s *stepDef, st *StepState, attempt int) {
	st.Status, st.Due, st.Reason, st.AwaitFrom, st.Unapplied = StepDone, nil, "", 0, false
	if st.StartedAt != nil && m.o.metrics != nil {
		typ, lat := m.d.typ, m.now.Sub(*st.StartedAt)
		m.after = append(m.after, func() { m.o.metrics.stepLatency.WithLabelValues(typ, s.name).Observe(lat.Seconds()) })
	}
	m.record("step_done", s.name, core.OperationAction, attempt, core.OutcomeSuccess, "")
}

// actionFailed handles a failure of a step's action: another try after a
// backoff if the policy allows, else the step fails.
func (m *machine) actionFailed(s *stepDef, st *StepState, cause error) error {
	st.Reason = cause.Error()
	if s.retryable(cause) && st.Tries < s.retry.MaxAttempts {
		st.Status, st.Due = StepBackoff, m.due(backoff.Exponential(st.Tries, s.retry.MinBackoff, s.retry.MaxBackoff))
		m.record("backoff", s.name, core.OperationAction, st.Attempt, "", st.Reason)
		return nil
	}
	st.Status, st.Due = StepFailed, nil
	return m.giveUp(s, fmt.Sprintf("step %s failed: %s", s.name, errReason(cause)))
}

// giveUp ends the forward run at step s: compensate before the pivot,
// stuck after it (or when the pivot itself may have taken effect).
func (m *machine) giveUp(s *stepDef, reason string) error {
	if s.group != "" {
		if m.in.LastError == "" {
			m.in.LastError = reason
		}
		return m.settleGroup(s.group)
	}
	st := m.in.state(s.name)
	if s.kind == Retriable || (s.kind == Pivot && st.Status == StepUncertain) {
		return m.stuck(reason)
	}
	return m.compensate(reason)
}

// timeout handles the expiry of the action's current try.
func (m *machine) actionTimeout(s *stepDef, st *StepState) error {
	m.record("timeout", s.name, core.OperationAction, st.Attempt, "", "")
	st.Reason = fmt.Sprintf("attempt %d timed out after %s", st.Attempt, s.timeout)
	switch s.onTimeout {
	case TimeoutStuck:
		return m.stuck(fmt.Sprintf("step %s: %s", s.name, st.Reason))
	case TimeoutCompensate:
		st.Status, st.Due = StepUncertain, nil
		return m.giveUp(s, fmt.Sprintf("step %s: %s", s.name, st.Reason))
	}
	if st.Tries < s.retry.MaxAttempts && (s.group == "" || !m.groupFailing(s.group)) {
		// The next attempt after a backoff, as after a failure, not at
		// once: a reply that is only late (queued behind others' replies)
		// still completes the step meanwhile (onReply accepts the reply of
		// any unanswered attempt), and a participant that is slow is not
		// sent more of the same work at the pace of the timeout.
		st.Status, st.Due = StepBackoff, m.due(backoff.Exponential(st.Tries, s.retry.MinBackoff, s.retry.MaxBackoff))
		m.record("backoff", s.name, core.OperationAction, st.Attempt, "", st.Reason)
		return nil
	}
	st.Status, st.Due = StepUncertain, nil
	return m.giveUp(s, fmt.Sprintf("step %s: %d attempts timed out", s.name, st.Tries))
}

// compensate starts (or continues) compensation from the current step down.
func (m *machine) compensate(reason string) error {
	m.in.Status, m.in.Phase, m.in.LastError = StatusCompensating, PhaseCompensating, reason
	m.record("compensate", m.in.Step, "", 0, "", reason)
	i, ok := m.d.index[m.in.Step]
	if !ok {
		i = len(m.d.steps) - 1
	}
	return m.compensateFrom(i)
}

// needsCompensation reports whether step s's action took effect, or may
// have: a remote action sent and not answered by a failure, a local step
// done, a step left mid-compensation, a remote step an operator skipped
// after its action was sent (it may have run: the barrier makes its
// compensation a no-op if it did not), or a wait step that applied some
// of its events (an all-of wait given up before the last one).
func needsCompensation(s *stepDef, st *StepState) bool {
	if st == nil {
		return false
	}
	applied := s.wait != nil && len(st.Events) > 0
	switch st.Status {
	case StepDone, StepUncertain, StepCompensating, StepCompBackoff:
		return true
	case StepRunning, StepBackoff:
		return s.remote && st.Attempt > 0
	case StepSkipped:
		return (s.remote && st.Attempt > 0) || applied
	case StepWaiting, StepFailed:
		return applied
	}
	return false
}

func (m *machine) compensateFrom(i int) error {
	m.in.Status, m.in.Phase = StatusCompensating, PhaseCompensating
	for ; i >= 0; i-- {
		s := m.d.steps[i]
		st := m.in.Steps[s.name]
		if s.kind != Compensatable || !needsCompensation(s, st) {
			continue
		}
		m.in.Step = s.name
		if !s.compensable() {
			// Nothing to undo (a read-only step).
			st.Status, st.Due = StepCompensated, nil
			continue
		}
		if st.Status != StepCompensating && st.Status != StepCompBackoff {
			st.Tries, st.AwaitFrom = 0, 0
		}
		st.Tries++
		st.CompensationAttempt++
		if s.child != nil {
			m.in.Attempts = st.CompensationAttempt
			gone, err := m.childGone(s, st) // child.go
			if err != nil {
				return err
			}
			if gone {
				continue
			}
			return m.compensateChildStep(s, st)
		}
		if s.comp != nil {
			st.Status, st.Due = StepCompensating, m.due(s.timeout)
			return m.command(s, s.comp, core.OperationCompensation, st.CompensationAttempt)
		}
		m.in.Attempts = st.CompensationAttempt
		stepErr, err := m.runLocal(s.localComp)
		if err != nil {
			return err
		}
		if stepErr != nil {
			m.record("failed", s.name, core.OperationCompensation, st.CompensationAttempt, "", stepErr.Error())
			return m.compensationFailed(s, st, stepErr.Error())
		}
		st.Status, st.Due, st.Reason = StepCompensated, nil, ""
		m.record("step_compensated", s.name, core.OperationCompensation, st.CompensationAttempt, core.OutcomeSuccess, "")
	}
	return m.end(StatusCompensated, m.in.LastError)
}

func (m *machine) compensationFailed(s *stepDef, st *StepState, reason string) error {
	st.Reason = reason
	if st.Tries < s.compRetry.MaxAttempts {
		st.Status, st.Due = StepCompBackoff, m.due(backoff.Exponential(st.Tries, s.compRetry.MinBackoff, s.compRetry.MaxBackoff))
		m.record("backoff", s.name, core.OperationCompensation, st.CompensationAttempt, "", reason)
		return nil
	}
	st.Due = nil
	return m.stuck(fmt.Sprintf("compensation of step %s failed %d times: %s", s.name, st.Tries, reason))
}

func (m *machine) compensationTimeout(s *stepDef, st *StepState) error {
	m.record("timeout", s.name, core.OperationCompensation, st.CompensationAttempt, "", "")
	return m.compensationFailed(s, st, fmt.Sprintf("attempt %d timed out after %s", st.CompensationAttempt, s.timeout))
}

func (m *machine) stuck(reason string) error {
	m.in.Status, m.in.LastError = StatusStuck, reason
	if st := m.in.Steps[m.in.Step]; st != nil {
		st.Due = nil
	}
	m.record("stuck", m.in.Step, "", 0, "", reason)
	if mt := m.o.metrics; mt != nil {
		typ := m.d.typ
		m.after = append(m.after, func() { mt.stuck.WithLabelValues(typ).Inc() })
	}
	return m.tellParent() // child.go
}

func (m *machine) end(status Status, reason string) error {
	m.in.Status, m.in.Step, m.in.LastError = status, "", reason
	m.in.EndedAt = &m.now
	m.record(string(status), "", "", 0, "", reason)
	if mt := m.o.metrics; mt != nil {
		typ := m.d.typ
		c := mt.completed
		if status == StatusCompensated {
			c = mt.compensated
		}
		m.after = append(m.after, func() { c.WithLabelValues(typ).Inc() })
	}
	return m.tellParent() // child.go
}

// reply is a participant's reply as the orchestrator reads it.
type reply struct {
	sagaID, sagaType, step, op, outcome, reason string
	attempt                                     int
	payload                                     []byte
	eventID                                     string
}

// ErrBadReply is wrapped (as core.Permanent) by the reply handler's
// error for a message that is not a saga reply: a missing or malformed
// saga header.
var ErrBadReply = errors.New("saga: not a saga reply")

func parseReply(md map[string]string, payload []byte) (reply, error) {
	r := reply{
		sagaID: md[core.MetadataSagaID], sagaType: md[core.MetadataSagaType],
		step: md[core.MetadataSagaStep], op: md[core.MetadataSagaOperation],
		outcome: md[core.MetadataSagaOutcome], reason: md[core.MetadataSagaReason],
		payload: payload, eventID: md[core.MetadataEventID],
	}
	bad := func(format string, args ...any) (reply, error) {
		return r, core.Permanent(fmt.Errorf("%w: %s", ErrBadReply, fmt.Sprintf(format, args...)))
	}
	if err := checkName(r.sagaID); err != nil {
		return bad("%s %q: %v", core.MetadataSagaID, r.sagaID, err)
	}
	if v := md[core.MetadataSagaProtocol]; v != "" && v != core.SagaProtocolVersion { // absent: version 1
		return bad("saga %s: %s %q is not supported (this orchestrator speaks version %s)",
			r.sagaID, core.MetadataSagaProtocol, v, core.SagaProtocolVersion)
	}
	if err := checkName(r.step); err != nil {
		return bad("saga %s: %s %q: %v", r.sagaID, core.MetadataSagaStep, r.step, err)
	}
	a, err := strconv.Atoi(md[core.MetadataSagaAttempt])
	if err != nil || a < 1 {
		return bad("saga %s: %s %q is not a positive number", r.sagaID, core.MetadataSagaAttempt, md[core.MetadataSagaAttempt])
	}
	r.attempt = a
	if r.op != core.OperationAction && r.op != core.OperationCompensation {
		return bad("saga %s: %s %q", r.sagaID, core.MetadataSagaOperation, r.op)
	}
	switch r.outcome {
	case core.OutcomeSuccess, core.OutcomeFailure, core.OutcomeCancelled:
	default:
		return bad("saga %s: %s %q", r.sagaID, core.MetadataSagaOutcome, r.outcome)
	}
	if len(r.payload) > 0 && !json.Valid(r.payload) {
		return bad("saga %s: reply payload is not JSON", r.sagaID)
	}
	return r, nil
}

// onReply applies a reply, or records it as fenced.
func (m *machine) onReply(r reply) error {
	fence := func(why string) error {
		m.fenced = true
		m.hist = append(m.hist, historyRow{sagaID: m.in.ID, at: m.now, event: "fenced", step: r.step, op: r.op,
			attempt: r.attempt, outcome: r.outcome, status: string(m.in.Status), reason: why})
		if mt := m.o.metrics; mt != nil {
			typ := m.d.typ
			m.after = append(m.after, func() { mt.fenced.WithLabelValues(typ).Inc() })
		}
		return nil
	}
	if m.in.Status == StatusPaused {
		return m.hold(r) // pause.go
	}
	if !m.in.Status.live() {
		return fence("saga is " + string(m.in.Status))
	}
	s, _ := m.d.step(r.step)
	if s == nil {
		return fence("no such step in v" + strconv.Itoa(m.d.version))
	}
	if r.step != m.in.Step && (s.group == "" || s.group != m.in.Step) {
		return fence("not waiting for this step (current step: " + m.in.Step + ")")
	}
	st := m.in.state(s.name)
	if !awaits(s, st, r) {
		return fence(fmt.Sprintf("not waiting for this reply (step %s is %q at action attempt %d, compensation attempt %d)",
			s.name, st.Status, st.Attempt, st.CompensationAttempt))
	}
	m.applied = true
	m.record("reply", r.step, r.op, r.attempt, r.outcome, r.reason)
	if r.op == core.OperationAction {
		st.AwaitFrom = 0 // answered: the attempts before are too
	}
	if r.op == core.OperationCompensation {
		if r.outcome == core.OutcomeSuccess {
			st.Status, st.Due, st.Reason = StepCompensated, nil, ""
			m.record("step_compensated", s.name, r.op, r.attempt, r.outcome, "")
			return m.compensateFrom(m.d.index[s.name] - 1)
		}
		return m.compensationFailed(s, st, r.outcome+": "+r.reason)
	}
	if r.outcome != core.OutcomeSuccess {
		return m.actionFailed(s, st, &StepError{Step: s.name, Outcome: r.outcome, Reason: r.reason})
	}
	if s.onSuccess != nil {
		data, err := s.onSuccess(m.in.Data, r.payload)
		if err == nil {
			err = checkStorable(data)
		}
		if err != nil {
			// The action took effect, but its reply cannot be applied:
			// nothing automatic is right, so an operator decides.
			// Retry sends the action again (its barrier answers the same
			// reply), in a parallel group as outside one.
			st.Status, st.Due, st.Unapplied = StepDone, nil, true
			return m.stuck(fmt.Sprintf("step %s: applying its reply: %v", s.name, err))
		}
		m.in.Data = data
	}
	m.stepDone(s, st, r.attempt)
	if s.group != "" {
		return m.settleGroup(s.group)
	}
	return m.advance(m.d.index[s.name] + 1)
}

// awaits reports whether step s (of the saga's current step or group)
// waits for reply r. A participant's barrier answers every attempt of one
// step's operation alike once it took effect or was cancelled (see
// "Retries and late replies" in the package documentation), so besides the
// latest attempt's reply it takes
//
//   - for the action: the success or cancellation of an earlier attempt
//     that timed out unanswered (AwaitFrom to Attempt), while the step runs
//     or backs off after that timeout (a failure is not final at the
//     barrier, as a later attempt runs the action again, so an earlier
//     attempt's failure says nothing of the current one);
//   - for the compensation: a success of any attempt sent, while the step
//     compensates or backs off (a compensation's success is final at the
//     barrier; its failure is not, as each retry runs it again, so an
//     earlier attempt's failure says nothing of the current one).
//
// Anything else is fenced: a reply for another operation, for a step that
// is not waiting (done, failed, compensated), a second answer to an
// attempt already answered, and an attempt never sent.
func awaits(s *stepDef, st *StepState, r reply) bool {
	switch r.op {
	case core.OperationAction:
		if !s.remote || s.child != nil || r.attempt > st.Attempt {
			return false
		}
		earlier := st.AwaitFrom > 0 && r.attempt >= st.AwaitFrom && (r.attempt == st.Attempt || r.outcome != core.OutcomeFailure)
		switch st.Status {
		case StepRunning:
			return r.attempt == st.Attempt || earlier
		case StepBackoff:
			return earlier
		}
	case core.OperationCompensation:
		if s.comp == nil || r.attempt > st.CompensationAttempt {
			return false
		}
		switch st.Status {
		case StepCompensating:
			return r.attempt == st.CompensationAttempt || r.outcome == core.OutcomeSuccess
		case StepCompBackoff:
			return r.outcome == core.OutcomeSuccess
		}
	}
	return false
}

// onWake fires the saga's due timer, if any.
func (m *machine) onWake() error {
	if m.in.Status == StatusScheduled {
		return m.startScheduled() // schedule.go
	}
	if !m.in.Status.live() {
		return nil
	}
	if m.in.DeadlineAt != nil && !m.now.Before(*m.in.DeadlineAt) {
		return m.onDeadline()
	}
	if r, ok := m.d.groups[m.in.Step]; ok && m.in.Phase == PhaseForward {
		g := m.in.Step
		for i := r[0]; i < r[1] && m.in.Step == g && m.in.Status == StatusRunning; i++ {
			if err := m.wakeStep(m.d.steps[i]); err != nil {
				return err
			}
		}
		return nil
	}
	s, _ := m.d.step(m.in.Step)
	if s == nil {
		return nil
	}
	return m.wakeStep(s)
}

// wakeStep fires step s's timer if it is due.
func (m *machine) wakeStep(s *stepDef) error {
	st := m.in.state(s.name)
	if st.Due == nil || m.now.Before(*st.Due) {
		return nil // woken early (a clock skew between processes): the save sets the timer again
	}
	switch st.Status {
	case StepRunning:
		return m.actionTimeout(s, st)
	case StepBackoff:
		m.record("retry", s.name, core.OperationAction, st.Attempt, "", st.Reason)
		return m.retry(s)
	case StepCompensating:
		return m.compensationTimeout(s, st)
	case StepCompBackoff:
		m.record("retry", s.name, core.OperationCompensation, st.CompensationAttempt, "", st.Reason)
		return m.compensateFrom(m.d.index[s.name])
	case StepWaiting:
		return m.waitTimeout(s, st) // await.go
	}
	return nil
}

func (m *machine) onDeadline() error {
	m.in.DeadlineAt = nil // fires once; an operator's retry is not re-stuck by it
	const reason = "deadline exceeded"
	m.record("deadline", m.in.Step, "", 0, "", reason)
	if r, ok := m.d.groups[m.in.Step]; ok {
		if m.in.Phase != PhaseForward || m.d.steps[r[0]].kind != Compensatable {
			return m.stuck(reason)
		}
		for i := r[0]; i < r[1]; i++ {
			s := m.d.steps[i]
			st := m.in.state(s.name)
			if st.Status == StepRunning || st.Status == StepBackoff {
				st.Status = StepFailed
				if s.remote && st.Attempt > 0 {
					st.Status = StepUncertain
				}
			}
			st.Due = nil
		}
		m.in.Step = m.d.steps[r[1]-1].name
		return m.compensate(reason)
	}
	s, _ := m.d.step(m.in.Step)
	if m.in.Phase == PhaseForward && !m.pastPivot() && s != nil && !(s.kind == Pivot && pivotMayHaveRun(s, m.in.state(s.name))) {
		st := m.in.state(s.name)
		if st.Status == StepRunning {
			st.Status = StepUncertain
		}
		st.Due = nil
		return m.compensate(reason)
	}
	return m.stuck(reason)
}

// pivotMayHaveRun reports whether pivot step s may have taken effect: an
// attempt of its remote action is unanswered (running, or backing off or
// given up after a timeout). Whatever its step status, the steps before it
// must then not be compensated.
func pivotMayHaveRun(s *stepDef, st *StepState) bool {
	if !s.remote || st.Attempt == 0 {
		return false
	}
	return st.AwaitFrom > 0 || st.Status == StepRunning || st.Status == StepUncertain
}

// nextWakeup is when the saga next needs a timer: its current step's due
// time or its deadline, whichever comes first; never for an ended or stuck saga.
func (m *machine) nextWakeup() *time.Time {
	if m.in.Status == StatusScheduled {
		return m.in.NextWakeupAt // its start time (schedule.go)
	}
	if !m.in.Status.live() {
		return nil
	}
	var next *time.Time
	if r, ok := m.d.groups[m.in.Step]; ok {
		for i := r[0]; i < r[1]; i++ {
			if st := m.in.Steps[m.d.steps[i].name]; st != nil && st.Due != nil && (next == nil || st.Due.Before(*next)) {
				next = st.Due
			}
		}
	} else if st := m.in.Steps[m.in.Step]; st != nil && st.Due != nil {
		next = st.Due
	}
	if d := m.in.DeadlineAt; d != nil && (next == nil || d.Before(*next)) {
		next = d
	}
	return next
}

// save writes the saga's new state, its history and its commands.
// save writes what m collected: saveMany of one.
func (m *machine) save() error {
	return m.o.saveMany(m.ctx, m.tx, []*machine{m}, nil)
}

// changed reports whether m's saga row is to be written: a reply that was
// only fenced, or held for a paused saga, leaves it as it is (its history
// line is written).
func (m *machine) changed() bool { return m.applied || !(m.fenced || m.held) }

func errReason(err error) string {
	var se *StepError
	if errors.As(err, &se) {
		return se.Outcome + ": " + se.Reason
	}
	return err.Error()
}
