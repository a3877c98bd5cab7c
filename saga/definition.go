package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/outbox"
)

// Kind says what a step's failure means for the saga.
type Kind int

const (
	// Compensatable steps come before the pivot. When the saga fails,
	// every compensatable step whose action took effect (or may have) is
	// compensated, in reverse order.
	Compensatable Kind = iota + 1
	// Pivot is the point of no return: once it succeeds the saga only
	// moves forward. A saga has at most one pivot; it has no compensation.
	Pivot
	// Retriable steps come after the pivot. They are retried by their
	// RetryPolicy and never compensated; a retriable step whose retry
	// budget is spent parks the saga as stuck.
	Retriable
)

func (k Kind) String() string {
	switch k {
	case Compensatable:
		return "compensatable"
	case Pivot:
		return "pivot"
	case Retriable:
		return "retriable"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// TimeoutAction is what a remote step's timeout does.
type TimeoutAction int

const (
	// TimeoutRetry sends the command again with a new attempt number,
	// after the step's RetryPolicy backoff, while the policy allows; then
	// the step fails (the saga compensates before the pivot, and is stuck
	// after it). A late reply to an earlier attempt, meanwhile or after,
	// completes the step. The default.
	TimeoutRetry TimeoutAction = iota
	// TimeoutCompensate fails the step at its first timeout: the saga
	// compensates (the step's own compensation included: its action may
	// have taken effect, and the participant's barrier turns a
	// compensation of an action that never ran into a no-op).
	TimeoutCompensate
	// TimeoutStuck parks the saga as stuck at the step's first timeout,
	// for an operator to decide.
	TimeoutStuck
	// TimeoutContinue is for a wait step only (Await.OnTimeout): when
	// the wait times out the saga goes on to the next step, the data as
	// the events that did arrive left it (none, for a single or any-of
	// wait). The step counts as done.
	TimeoutContinue
)

func (a TimeoutAction) String() string {
	switch a {
	case TimeoutRetry:
		return "retry"
	case TimeoutCompensate:
		return "compensate"
	case TimeoutStuck:
		return "stuck"
	case TimeoutContinue:
		return "continue"
	}
	return fmt.Sprintf("TimeoutAction(%d)", int(a))
}

// RetryPolicy says how often an operation is tried and how long to wait
// between tries.
type RetryPolicy struct {
	// MaxAttempts is the number of tries in all, the first included. Zero
	// means "no policy": the default applies (Spec.Defaults, see Step). A
	// retriable step must have it, from itself or from Spec.Defaults.
	MaxAttempts int
	// MinBackoff is the wait before the second try; it doubles per try up
	// to MaxBackoff. Defaults to 1s.
	MinBackoff time.Duration
	// MaxBackoff caps the wait. Defaults to 1m.
	MaxBackoff time.Duration
	// Retryable reports whether a failure is worth another try. err is a
	// *StepError for a participant's failure reply, or what a local step
	// returned. A timeout is always retried. Defaults: for a retriable
	// step every failure is retried; otherwise a failure reply or a
	// core.Permanent error is not (the saga compensates at once) and
	// any other local error is.
	Retryable func(err error) bool
}

func (p RetryPolicy) withDefaults(attempts int) RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = attempts
	}
	if p.MinBackoff == 0 {
		p.MinBackoff = time.Second
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = time.Minute
	}
	if p.MaxBackoff < p.MinBackoff {
		p.MaxBackoff = p.MinBackoff
	}
	return p
}

// Command is a message a remote step sends to a participant: its topic,
// its name (which the participant routes on, core.MetadataSagaCommand)
// and its payload, built from the saga's data.
type Command[D any] struct {
	// Topic is the participant's command topic. Required.
	Topic string
	// Name is the command's name. Defaults to the step's name.
	Name string
	// Payload builds the command's payload from the data; the result is
	// encoded as JSON. Defaults to the data itself.
	Payload func(data D) (any, error)
}

// Step is one step of a saga. A step is remote (Action set: a command to a
// participant, which replies), local (Local set: a function the
// orchestrator runs in its own transaction), a wait (Await set: it waits
// for events delivered with Signal or SignalTx) or a child step (Child
// set: it starts another saga and waits for its end), exactly one of them.
type Step[D any] struct {
	// Name identifies the step in the stored state and on the wire; steps
	// are never identified by position. Required, unique in the
	// definition, at most 200 bytes of UTF-8 without NUL.
	Name string
	// Kind is Compensatable, Pivot or Retriable. Required.
	Kind Kind
	// Group, when set, puts the step in a parallel group: adjacent steps
	// with the same Group run together, and the saga moves on when every
	// member succeeded. When a member fails, the members still in flight
	// are waited for (a reply or a timeout, with no further retry), then
	// the members that took effect (or may have) and the steps before
	// are compensated, in reverse order. A group's members are all
	// compensatable or all retriable (a retriable group's failure parks
	// the saga as stuck); the pivot is never in a group. The group's name
	// is the saga's current step while it runs: it must differ from every
	// step name.
	Group string

	// Action is a remote step's command.
	Action *Command[D]
	// OnSuccess applies a success reply's payload to the data (see
	// Reply for a typed version). Defaults to leaving the data as is.
	OnSuccess func(data *D, reply json.RawMessage) error
	// Compensation is a remote step's compensation command, for a
	// compensatable step whose action needs undoing. Its Topic, Name and
	// Payload default to the Action's: a participant built with package
	// compensation registers an action and its compensation under one
	// command name and receives the action's payload again, so
	// &saga.Command[D]{} is all such a step needs.
	Compensation *Command[D]

	// Local is a local step's function. It runs in the orchestrator's
	// transaction (under a savepoint) and may change the data; its
	// database writes commit with the saga's state. Return Fail(reason)
	// or a core.Permanent error for a business failure.
	Local func(ctx context.Context, tx pgx.Tx, data *D) error
	// LocalCompensation undoes a local compensatable step, in the same
	// way. It must succeed eventually: a failing one is retried by
	// CompensationRetry and then the saga is stuck.
	LocalCompensation func(ctx context.Context, tx pgx.Tx, data *D) error

	// Child makes the step start a child saga and complete when it ends
	// (see Child). A child step has no Action, Local, Await, OnSuccess or
	// compensation of its own (compensating it compensates the child),
	// is in no parallel group, and Timeout does not apply to it, nor may
	// OnTimeout be set (the child has its own Spec.Deadline).
	Child *Child[D]

	// When, if set, is the step's condition: it is called with the data
	// when the saga reaches the step (once: not again for a retry), and
	// when it returns false the step
	// is skipped (StepSkipped, a "skipped" history line with outcome
	// "condition"), never runs, and is never compensated. A pivot cannot
	// be conditional. Defaults to nil: the step always runs.
	When func(data D) bool

	// Await makes the step a wait for external events (see Await). A
	// wait has no Action or Local, and Timeout, OnTimeout and Retry do
	// not apply to it (set Await.Timeout and Await.OnTimeout); before the
	// pivot it may have a LocalCompensation.
	Await *Await[D]

	// Timeout is how long a remote step waits for a reply to one attempt
	// (of its action or its compensation). Defaults to Spec.Defaults's,
	// else 30s.
	Timeout time.Duration
	// OnTimeout is what the action's timeout does. Defaults to
	// TimeoutRetry. A compensation's timeout always retries it.
	OnTimeout TimeoutAction
	// Retry is the action's retry policy; each zero field defaults to
	// Spec.Defaults's, else to 3 attempts, 1s to 1m apart. A retriable
	// step needs MaxAttempts here or in Spec.Defaults.
	Retry RetryPolicy
	// CompensationRetry is the compensation's retry policy (a failure
	// reply of a compensation is always retried). When its attempts are
	// spent the saga is stuck. Each zero field defaults to
	// Spec.Defaults's, else to 8 attempts, 1s to 1m apart.
	CompensationRetry RetryPolicy
}

// Spec is what a saga type is made of; Define checks it.
type Spec[D any] struct {
	// Type names the saga type. Required.
	Type string
	// Version is the definition's version, explicit: an instance records
	// it and finishes on it. Bump it whenever the steps change. Required,
	// at least 1.
	Version int
	// ReplyTopic is where participants reply to this type's commands.
	// Defaults to "saga.<Type>.replies" (then Type must hold only a-z,
	// A-Z, 0-9, '.', '_' and '-', as topic names on Kafka do).
	ReplyTopic string
	// Steps in order. Required.
	Steps []Step[D]
	// Deadline bounds a saga's life from its start: when it passes, a saga
	// before its pivot compensates, any other still running is stuck with
	// reason "deadline exceeded". Defaults to 24h; a negative value turns
	// it off.
	Deadline time.Duration
	// Defaults is the policy every step inherits where it sets none, so a
	// small saga sets its timeout and retries once. Defaults to the
	// built-in step defaults (see StepDefaults).
	Defaults StepDefaults
	// Keys are the saga's correlation keys (see Key): SignalByKey finds
	// the running sagas holding a value. Defaults to none.
	Keys []Key[D]
	// Attributes are the saga's search attributes (see Attr), for List
	// and bulk queries. Defaults to none.
	Attributes []Attr[D]
}

// StepDefaults is a definition's default step policy (Spec.Defaults).
// Each field a step leaves zero (Step.Timeout, each field of Step.Retry and
// of Step.CompensationRetry) is taken from here, and what is zero here too
// from the built-in defaults: 30s timeout; 3 attempts of an action and 8 of
// a compensation, 1s to 1m apart.
//
// How to choose them:
//   - Timeout: longer than a participant takes to answer when all is well,
//     end to end (the relay's poll or wake-up, the broker, the consumer, the
//     handler's transaction, the way back), with room for a slow moment: a
//     timeout sends the command again with a new attempt, which the barrier
//     makes safe but which is load. A few times the p99 of a step.
//   - Retry: attempts times backoff should outlast what you expect to ride
//     out without a person (a participant restarting, a short outage);
//     what takes longer compensates (or, after the pivot, parks the saga).
//     Setting Retry.MaxAttempts here also gives retriable steps their
//     required policy.
//   - CompensationRetry: more and longer than Retry, since an undo must
//     succeed: when its attempts are spent the saga is stuck for a person.
//   - Spec.Deadline should exceed the sum of the steps' worst cases, or it
//     ends sagas that were still making progress.
type StepDefaults struct {
	// Timeout is a remote step's default Timeout. Defaults to 30s.
	Timeout time.Duration
	// Retry is the default action retry policy, field by field. Defaults
	// to 3 attempts, 1s to 1m apart.
	Retry RetryPolicy
	// CompensationRetry is the default compensation retry policy, field by
	// field. Defaults to 8 attempts, 1s to 1m apart.
	CompensationRetry RetryPolicy
}

// inherit fills the zero fields of p from d.
func (p RetryPolicy) inherit(d RetryPolicy) RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.MinBackoff == 0 {
		p.MinBackoff = d.MinBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = d.MaxBackoff
	}
	if p.Retryable == nil {
		p.Retryable = d.Retryable
	}
	return p
}

// Definition is a checked saga type of data D. Register it with an
// Orchestrator and start instances with Start or StartTx. It is immutable
// and safe for concurrent use.
type Definition[D any] struct {
	def *def
}

// Type returns the saga type's name.
func (d *Definition[D]) Type() string { return d.def.typ }

// Version returns the definition's version.
func (d *Definition[D]) Version() int { return d.def.version }

// ReplyTopic returns the topic participants reply to.
func (d *Definition[D]) ReplyTopic() string { return d.def.replyTopic }

func (d *Definition[D]) erased() *def { return d.def }

// Registrable is a *Definition of any data type.
type Registrable interface{ erased() *def }

// Reply adapts a typed success handler to Step.OnSuccess: the reply
// payload is decoded from JSON into R first.
func Reply[D, R any](fn func(data *D, reply R) error) func(*D, json.RawMessage) error {
	return func(d *D, raw json.RawMessage) error {
		var r R
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &r); err != nil {
				return fmt.Errorf("saga: decode reply: %w", err)
			}
		}
		return fn(d, r)
	}
}

// ErrStepFailed is wrapped by every business failure of a step: a
// participant's failure (or cancelled) reply, as a *StepError, and Fail.
var ErrStepFailed = errors.New("saga: step failed")

// StepError is a participant's failure reply, as RetryPolicy.Retryable
// sees it.
type StepError struct {
	Step    string
	Outcome string // core.OutcomeFailure or core.OutcomeCancelled
	Reason  string
}

func (e *StepError) Error() string {
	return fmt.Sprintf("saga: step %s: %s: %s", e.Step, e.Outcome, e.Reason)
}

func (e *StepError) Unwrap() error { return ErrStepFailed }

// Fail returns a business failure for a local step: it is not retried
// (unless the step's RetryPolicy.Retryable says so), and the saga
// compensates.
func Fail(reason string) error {
	return core.Permanent(fmt.Errorf("%w: %s", ErrStepFailed, reason))
}

// Define checks spec and returns its Definition. Every problem is refused
// here, not at run time, with an error wrapping core.ErrConfig that
// names the step: a missing name, a duplicate name, a step with no command
// (or both a command and a local function), a compensatable step after the
// pivot, a second pivot, a retriable step before the pivot or without a
// retry policy, a compensation on a pivot or retriable step, a remote
// compensation on a local step (or the reverse), a TimeoutCompensate after
// the pivot, a topic no outbox can write (NUL, invalid UTF-8, longer than
// outbox.MaxKeyBytes), and a Type that would make a default reply topic
// brokers refuse (anything but a-z, A-Z, 0-9, '.', '_' and '-', "order
// saga" say) when ReplyTopic is not set. Register checks the topics
// against the orchestrator's Writer (WriterConfig.ValidateTopic).
func Define[D any](spec Spec[D]) (*Definition[D], error) {
	d, err := define(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: saga %q v%d: %v", core.ErrConfig, spec.Type, spec.Version, err)
	}
	return &Definition[D]{def: d}, nil
}

// define checks spec and erases its types.
func define[D any](spec Spec[D]) (*def, error) {
	if err := checkName(spec.Type); err != nil {
		return nil, fmt.Errorf("type: %v", err)
	}
	if spec.Version < 1 {
		return nil, fmt.Errorf("Version must be at least 1, got %d", spec.Version)
	}
	if len(spec.Steps) == 0 {
		return nil, errors.New("no steps")
	}
	steps, err := withDefaults(spec.Steps, spec.Defaults)
	if err != nil {
		return nil, err
	}
	d := &def{typ: spec.Type, version: spec.Version, replyTopic: spec.ReplyTopic, deadline: spec.Deadline, pivot: -1}
	if d.replyTopic == "" {
		d.replyTopic = "saga." + spec.Type + ".replies"
		if strings.IndexFunc(spec.Type, notPortable) >= 0 {
			return nil, fmt.Errorf("Type makes the default reply topic %q, which brokers such as Kafka refuse (they take only a-z, A-Z, 0-9, '.', '_' and '-'): set ReplyTopic, or change the Type", d.replyTopic)
		}
	} else if err := checkTopic(d.replyTopic); err != nil {
		return nil, fmt.Errorf("ReplyTopic: %v", err)
	}
	if d.deadline == 0 {
		d.deadline = 24 * time.Hour
	}
	d.index = make(map[string]int, len(steps))
	for i, s := range steps {
		if err := checkName(s.Name); err != nil {
			return nil, fmt.Errorf("step %d: name: %v", i, err)
		}
		if _, dup := d.index[s.Name]; dup {
			return nil, fmt.Errorf("two steps are named %q", s.Name)
		}
		d.index[s.Name] = i
		if err := checkShape(s); err != nil {
			return nil, fmt.Errorf("step %q%v", s.Name, err)
		}
		if err := checkKind(s, i, &d.pivot, steps); err != nil {
			return nil, err
		}
		d.steps = append(d.steps, eraseStep(s))
	}
	if err := setGroups(d, steps); err != nil {
		return nil, err
	}
	if d.attrs, err = eraseAttrs(spec.Keys, spec.Attributes); err != nil { // attr.go
		return nil, err
	}
	return d, nil
}

// withDefaults returns a copy of steps (the caller's stay as they are) with
// dflt's timeout and retry policies where a step sets none.
func withDefaults[D any](steps []Step[D], dflt StepDefaults) ([]Step[D], error) {
	if dflt.Timeout < 0 || dflt.Retry.MaxAttempts < 0 || dflt.CompensationRetry.MaxAttempts < 0 ||
		dflt.Retry.MinBackoff < 0 || dflt.Retry.MaxBackoff < 0 || dflt.CompensationRetry.MinBackoff < 0 || dflt.CompensationRetry.MaxBackoff < 0 {
		return nil, errors.New("Defaults: negative Timeout, MaxAttempts or backoff")
	}
	steps = append([]Step[D](nil), steps...)
	for i := range steps {
		s := &steps[i]
		if s.Timeout == 0 {
			s.Timeout = dflt.Timeout
		}
		s.Retry = s.Retry.inherit(dflt.Retry)
		s.CompensationRetry = s.CompensationRetry.inherit(dflt.CompensationRetry)
	}
	return steps, nil
}

// checkShape checks what a step runs: a remote command, a local function
// or a wait, with a compensation of its kind, and its timeout and retry
// numbers. Its error follows the step's name.
func checkShape[D any](s Step[D]) error {
	remote, local, wait := s.Action != nil, s.Local != nil, s.Await != nil
	switch {
	case s.Child != nil:
		if err := checkChild(s); err != nil { // child.go
			return fmt.Errorf(": %v", err)
		}
		return nil
	case !remote && !local && !wait:
		return errors.New(" has no command: set Action (remote), Local, Await (a wait) or Child")
	case wait:
		if err := checkAwait(s); err != nil { // await.go
			return fmt.Errorf(": %v", err)
		}
	case remote && local:
		return errors.New(" has both Action and Local: a step is remote or local")
	case remote && s.LocalCompensation != nil:
		return errors.New(" is remote but has a LocalCompensation: use Compensation")
	case local && s.Compensation != nil:
		return errors.New(" is local but has a remote Compensation: use LocalCompensation")
	case local && s.OnSuccess != nil:
		return errors.New(" is local: OnSuccess applies to remote replies; change the data in Local")
	}
	if remote {
		if s.Action.Topic == "" {
			return errors.New(": Action.Topic is required")
		}
		if err := checkTopic(s.Action.Topic); err != nil {
			return fmt.Errorf(": Action.Topic: %v", err)
		}
		if s.Compensation != nil && s.Compensation.Topic != "" {
			if err := checkTopic(s.Compensation.Topic); err != nil {
				return fmt.Errorf(": Compensation.Topic: %v", err)
			}
		}
	}
	switch {
	case s.OnTimeout < TimeoutRetry || s.OnTimeout > TimeoutStuck:
		return fmt.Errorf(": unknown OnTimeout %d", s.OnTimeout)
	case s.Timeout < 0:
		return errors.New(": negative Timeout")
	case s.Retry.MaxAttempts < 0 || s.CompensationRetry.MaxAttempts < 0:
		return errors.New(": negative MaxAttempts")
	case s.Retry.MinBackoff < 0 || s.Retry.MaxBackoff < 0 || s.CompensationRetry.MinBackoff < 0 || s.CompensationRetry.MaxBackoff < 0:
		return errors.New(": negative backoff")
	}
	return nil
}

// checkKind checks the place of step i (s) among steps for its Kind:
// compensatable steps first, at most one pivot (set in *pivot), retriable
// steps after it.
func checkKind[D any](s Step[D], i int, pivot *int, steps []Step[D]) error {
	compensable := s.Compensation != nil || s.LocalCompensation != nil
	switch s.Kind {
	case Compensatable:
		if *pivot >= 0 {
			return fmt.Errorf("compensatable step %q comes after the pivot %q: a saga never compensates after its pivot", s.Name, steps[*pivot].Name)
		}
	case Pivot:
		if *pivot >= 0 {
			return fmt.Errorf("step %q is a second pivot (the first is %q)", s.Name, steps[*pivot].Name)
		}
		if compensable {
			return fmt.Errorf("pivot step %q has a compensation: the pivot is the point of no return", s.Name)
		}
		if s.When != nil {
			// Skipped, it would let the steps after it (retriable, never
			// compensated) run although the point of no return was never
			// passed.
			return fmt.Errorf("pivot step %q has a condition (When): the point of no return cannot be skipped", s.Name)
		}
		if s.OnTimeout == TimeoutCompensate {
			// A pivot that timed out may have taken effect; it cannot be
			// undone, so only the steps before it would be.
			return fmt.Errorf("pivot step %q: OnTimeout TimeoutCompensate would compensate around a pivot that may have taken effect; use TimeoutRetry or TimeoutStuck", s.Name)
		}
		*pivot = i
	case Retriable:
		if *pivot < 0 {
			return fmt.Errorf("retriable step %q comes before any pivot: retriable steps follow the pivot", s.Name)
		}
		if compensable {
			return fmt.Errorf("retriable step %q has a compensation: steps after the pivot are never compensated", s.Name)
		}
		if s.Retry.MaxAttempts == 0 && s.Await == nil {
			return fmt.Errorf("retriable step %q has no retry policy (set its Retry.MaxAttempts, or Spec.Defaults.Retry.MaxAttempts)", s.Name)
		}
		if s.OnTimeout == TimeoutCompensate {
			return fmt.Errorf("retriable step %q: OnTimeout is TimeoutCompensate, but steps after the pivot never compensate", s.Name)
		}
	default:
		return fmt.Errorf("step %q: Kind is required (Compensatable, Pivot or Retriable)", s.Name)
	}
	return nil
}

// setGroups checks the parallel groups of steps (adjacent steps with the
// same Group, all compensatable or all retriable) and records them in d.
func setGroups[D any](d *def, steps []Step[D]) error {
	d.groups = map[string][2]int{}
	for i := 0; i < len(steps); {
		g := steps[i].Group
		if g == "" {
			i++
			continue
		}
		if err := checkName(g); err != nil {
			return fmt.Errorf("group of step %q: %v", steps[i].Name, err)
		}
		if _, clash := d.index[g]; clash {
			return fmt.Errorf("group %q has the name of a step", g)
		}
		if _, seen := d.groups[g]; seen {
			return fmt.Errorf("group %q is split: its steps must be adjacent", g)
		}
		j := i
		for j < len(steps) && steps[j].Group == g {
			if k := steps[j].Kind; k == Pivot || k != steps[i].Kind {
				return fmt.Errorf("group %q: step %q is %s; a group's steps are all compensatable or all retriable, never the pivot", g, steps[j].Name, k)
			}
			d.steps[j].group = g
			j++
		}
		d.groups[g] = [2]int{i, j}
		i = j
	}
	return nil
}

func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 200:
		return errors.New("longer than 200 bytes")
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	}
	for _, r := range s {
		if r == 0 {
			return errors.New("contains NUL")
		}
	}
	return nil
}

// checkTopic refuses a topic no outbox writes: one with NUL or invalid
// UTF-8, or longer than outbox.MaxKeyBytes. What a transport refuses
// besides, Register checks with the orchestrator's Writer.
func checkTopic(t string) error {
	switch {
	case !utf8.ValidString(t):
		return fmt.Errorf("%q is not valid UTF-8", t)
	case strings.IndexByte(t, 0) >= 0:
		return fmt.Errorf("%q contains NUL", t)
	case len(t) > outbox.MaxKeyBytes:
		return fmt.Errorf("longer than %d bytes", outbox.MaxKeyBytes)
	}
	return nil
}

// notPortable reports whether r may not appear in a topic name on some
// common broker (Kafka takes only these).
func notPortable(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
}

// def is a definition with its data type erased: the engine works on JSON.
type def struct {
	typ        string
	version    int
	replyTopic string
	deadline   time.Duration
	steps      []*stepDef
	index      map[string]int
	pivot      int // index of the pivot step, -1 if none
	// groups maps a parallel group's name to its steps' index range [from, to).
	groups map[string][2]int
	attrs  *attrsDef // keys and search attributes, nil if none (attr.go)
}

// startsRemote reports whether a start runs no local step: the first step
// (or every member of the first group) is remote and unconditional (a
// skipped one would run the next step at once).
func (d *def) startsRemote() bool {
	first := d.steps[0]
	if first.group == "" {
		return first.remote && first.when == nil && first.child == nil
	}
	r := d.groups[first.group]
	for _, s := range d.steps[r[0]:r[1]] {
		if !s.remote || s.when != nil {
			return false
		}
	}
	return true
}

func (d *def) step(name string) (*stepDef, int) {
	i, ok := d.index[name]
	if !ok {
		return nil, -1
	}
	return d.steps[i], i
}

type command struct {
	topic, name string
	payload     func(data []byte) ([]byte, error)
}

type stepDef struct {
	name      string
	group     string
	kind      Kind
	remote    bool
	action    *command
	comp      *command
	onSuccess func(data, reply []byte) ([]byte, error)
	local     func(ctx context.Context, tx pgx.Tx, data []byte) ([]byte, error)
	localComp func(ctx context.Context, tx pgx.Tx, data []byte) ([]byte, error)
	timeout   time.Duration
	onTimeout TimeoutAction
	retry     RetryPolicy
	compRetry RetryPolicy
	wait      *waitDef // a wait step's events (await.go)
	when      func(data []byte) (bool, error)
	// child is a child step's saga (child.go); such a step is remote too:
	// what it starts runs out of the saga's transaction.
	child *childDef
}

func (s *stepDef) compensable() bool { return s.comp != nil || s.localComp != nil || s.child != nil }

// retryable reports whether err (a failure of the action) is worth another
// try under the step's policy.
func (s *stepDef) retryable(err error) bool {
	if s.retry.Retryable != nil {
		return s.retry.Retryable(err)
	}
	if s.kind == Retriable {
		return true
	}
	return !errors.Is(err, ErrStepFailed) && !core.IsPermanent(err)
}

func eraseStep[D any](s Step[D]) *stepDef {
	sd := &stepDef{
		name: s.Name, kind: s.Kind, remote: s.Action != nil || s.Child != nil,
		timeout: s.Timeout, onTimeout: s.OnTimeout,
		retry:     s.Retry.withDefaults(3),
		compRetry: s.CompensationRetry.withDefaults(8),
	}
	if sd.timeout == 0 {
		sd.timeout = 30 * time.Second
	}
	if s.Action != nil {
		sd.action = eraseCommand(s.Name, s.Action)
	}
	if s.Compensation != nil {
		c := *s.Compensation
		if c.Topic == "" {
			c.Topic = s.Action.Topic
		}
		if c.Name == "" {
			c.Name = s.Action.Name
		}
		if c.Payload == nil {
			c.Payload = s.Action.Payload
		}
		sd.comp = eraseCommand(s.Name, &c)
	}
	if s.OnSuccess != nil {
		fn := s.OnSuccess
		sd.onSuccess = func(data, reply []byte) ([]byte, error) {
			return withData(data, func(d *D) error { return fn(d, reply) })
		}
	}
	if s.Local != nil {
		fn := s.Local
		sd.local = func(ctx context.Context, tx pgx.Tx, data []byte) ([]byte, error) {
			return withData(data, func(d *D) error { return fn(ctx, tx, d) })
		}
	}
	if s.Await != nil {
		sd.wait = eraseAwait(s.Await) // await.go
	}
	if s.When != nil {
		sd.when = eraseWhen(s.When) // when.go
	}
	if s.Child != nil {
		sd.child = eraseChild(s.Child) // child.go
	}
	if s.LocalCompensation != nil {
		fn := s.LocalCompensation
		sd.localComp = func(ctx context.Context, tx pgx.Tx, data []byte) ([]byte, error) {
			return withData(data, func(d *D) error { return fn(ctx, tx, d) })
		}
	}
	return sd
}

func eraseCommand[D any](step string, c *Command[D]) *command {
	name := c.Name
	if name == "" {
		name = step
	}
	return &command{topic: c.Topic, name: name, payload: erasePayload(c.Payload)}
}

// erasePayload erases fn, which builds a JSON value from the data: a nil
// fn leaves the data as it is.
func erasePayload[D any](fn func(data D) (any, error)) func(data []byte) ([]byte, error) {
	return func(data []byte) (_ []byte, err error) {
		if fn == nil {
			return data, nil
		}
		defer recoverInto(&err)
		var d D
		if err := json.Unmarshal(data, &d); err != nil {
			return nil, fmt.Errorf("saga: decode data: %w", err)
		}
		v, err := fn(d)
		if err != nil {
			return nil, err
		}
		return json.Marshal(v)
	}
}

// withData decodes data, runs fn on it and encodes the result.
// A panic in fn is returned as an error wrapping ErrPanic.
func withData[D any](data []byte, fn func(*D) error) (_ []byte, err error) {
	defer recoverInto(&err)
	var d D
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("saga: decode data: %w", err)
	}
	if err := fn(&d); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// ErrPanic is wrapped by the error a definition's function (Local,
// LocalCompensation, OnSuccess, a Payload) turns into when it panics: the
// orchestrator treats it as that function's failure instead of crashing.
var ErrPanic = errors.New("saga: panic in a definition's function")

func recoverInto(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("%w: %v", ErrPanic, r)
	}
}
