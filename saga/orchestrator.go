package saga

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config configures an Orchestrator.
type Config struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Writer writes commands to the outbox. Defaults to a new
	// outbox.Writer on Schema.
	Writer *outbox.Writer
	// Consumer is the inbox consumer name the reply handler deduplicates
	// under. Defaults to "millrace-saga".
	Consumer string
	// Clock tells the orchestrator the time. Timeouts, backoff and
	// deadlines are computed from it, never from the database's clock, so
	// a test can drive them with a clock of its own (sagatest.Clock).
	// Defaults to the real time.
	Clock interface{ Now() time.Time }
	// PollInterval is how often Run looks for due timers. Defaults to 1s.
	PollInterval time.Duration
	// ClaimBatch is the most due sagas one timer transaction claims.
	// Defaults to 100.
	ClaimBatch int
	// MaxTimerFailures is how many times in a row a saga's timer may fail
	// technically (a database error, a failing Hook: not a step's failure,
	// which its retry policy handles) before the saga is parked as stuck
	// with the error as its reason. Until then each failure is rolled back
	// alone, recorded in the history ("timer_failed"), and the saga tried
	// again after a backoff (PollInterval, doubling, up to 30 times it)
	// while the other sagas' timers go on. The count is kept in the
	// history, so it survives restarts. An operator request that fails so
	// often is dropped, recorded as "operator_refused". Defaults to 5.
	MaxTimerFailures int
	// Hook, when set, is called at each persistence boundary: the
	// sagatest harness sets it to inject crashes there (its type is
	// internal; a service leaves it unset, and it costs nothing).
	Hook sagahook.Func
	// Metrics, when set, registers the orchestrator's Prometheus collector
	// with it: the series listed in the package documentation ("Metrics").
	// Orchestrators sharing a Registerer share the collector; wrap it with
	// prometheus.WrapRegistererWith for labels of your own (a Service
	// labels the series with its name). Defaults to nil: nothing counted.
	Metrics prometheus.Registerer
	// NoProgressAfter is how long a running or compensating saga may go
	// unchanged before the no_progress gauge counts it. Defaults to 10
	// minutes.
	NoProgressAfter time.Duration
	// Logger logs unregistered versions and timer and reply-batch errors.
	// Defaults to errors to slog.Default() (outbox.DefaultLogger).
	Logger watermill.LoggerAdapter
}

// Orchestrator runs sagas: it starts them (Start, StartTx), handles their
// participants' replies (Handler), fires their timers (Run, RunDue), and
// carries out operator actions. Several orchestrators, in one process or
// many, may share a schema: every change to a saga happens under a row
// lock on it. It is safe for concurrent use.
type Orchestrator struct {
	pool   *pgxpool.Pool
	schema string
	writer *outbox.Writer
	dedup  *inbox.Deduplicator
	clock  interface{ Now() time.Time }
	poll   time.Duration
	batch  int
	// maxFailures is Config.MaxTimerFailures.
	maxFailures int
	hook        sagahook.Func
	metrics     *metrics
	logger      watermill.LoggerAdapter
	sql         statements
	consumer    string
	// trail records operator actions in the audit trail (internal/audit).
	trail *audit.Trail

	mu   sync.RWMutex
	defs map[string]map[int]*def
	// woken cuts Run's wait short: an event between a parent and its child
	// saga was committed for the timer pass (child.go).
	woken chan struct{}
}

// New returns an Orchestrator on pool. It does not touch the database.
func New(pool *pgxpool.Pool, cfg Config) (*Orchestrator, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: saga.New: nil pool", core.ErrConfig)
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: saga.Config.Schema: %v", core.ErrConfig, err)
	}
	if cfg.PollInterval < 0 || cfg.ClaimBatch < 0 || cfg.MaxTimerFailures < 0 {
		return nil, fmt.Errorf("%w: saga.Config: PollInterval, ClaimBatch and MaxTimerFailures must not be negative", core.ErrConfig)
	}
	if cfg.Writer == nil {
		if cfg.Writer, err = outbox.NewWriter(pool, outbox.WriterConfig{Schema: schema}); err != nil {
			return nil, fmt.Errorf("%w: saga.Config: %v", core.ErrConfig, err)
		}
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "millrace-saga"
	}
	dedup, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: cfg.Consumer})
	if err != nil {
		return nil, fmt.Errorf("%w: saga.Config: %v", core.ErrConfig, err)
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.ClaimBatch == 0 {
		cfg.ClaimBatch = 100
	}
	if cfg.MaxTimerFailures == 0 {
		cfg.MaxTimerFailures = 5
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	if cfg.NoProgressAfter <= 0 {
		cfg.NoProgressAfter = 10 * time.Minute
	}
	o := &Orchestrator{
		pool: pool, schema: schema, writer: cfg.Writer, dedup: dedup, clock: cfg.Clock,
		poll: cfg.PollInterval, batch: cfg.ClaimBatch, maxFailures: cfg.MaxTimerFailures, hook: cfg.Hook,
		logger: cfg.Logger, sql: newStatements(schema), consumer: cfg.Consumer, trail: audit.New(schema),
		defs: map[string]map[int]*def{}, woken: make(chan struct{}, 1),
	}
	if cfg.Metrics != nil {
		if o.metrics, err = registerMetrics(cfg.Metrics, o, cfg.NoProgressAfter); err != nil {
			return nil, fmt.Errorf("%w: saga.Config.Metrics: %v", core.ErrConfig, err)
		}
		if err := audit.Register(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("%w: saga.Config.Metrics: %v", core.ErrConfig, err)
		}
	}
	return o, nil
}

// Register adds definitions, and the definitions of their child steps
// (Step.Child). Several versions of one type may be
// registered at once: each instance runs on the version it started with.
// Registering a type and version twice is an error wrapping
// core.ErrConfig, unless it is the very same *Definition; so is a
// definition whose command or reply topic the Writer refuses
// (WriterConfig.ValidateTopic; the error wraps the *outbox.EventError too).
func (o *Orchestrator) Register(defs ...Registrable) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range withChildren(defs) { // child.go
		if r == nil {
			return fmt.Errorf("%w: saga.Register: nil definition", core.ErrConfig)
		}
		d := r.erased()
		if err := o.checkTopics(d); err != nil {
			return err
		}
		byVersion := o.defs[d.typ]
		if byVersion == nil {
			byVersion = map[int]*def{}
			o.defs[d.typ] = byVersion
		}
		if prev, ok := byVersion[d.version]; ok && prev != d {
			return fmt.Errorf("%w: saga %q v%d is registered already", core.ErrConfig, d.typ, d.version)
		}
		byVersion[d.version] = d
	}
	return nil
}

// checkTopics checks d's reply topic and command topics as the Writer
// checks an event's topic.
func (o *Orchestrator) checkTopics(d *def) error {
	check := func(what, topic string) error {
		err := o.writer.Validate(outbox.Event{Topic: topic, PartitionKey: d.typ, Payload: []byte("{}")})
		if err != nil {
			return fmt.Errorf("%w: saga %q v%d: %s topic %q: %w", core.ErrConfig, d.typ, d.version, what, topic, err)
		}
		return nil
	}
	if err := check("reply", d.replyTopic); err != nil {
		return err
	}
	for _, s := range d.steps {
		for _, c := range []*command{s.action, s.comp} {
			if c != nil {
				if err := check("step "+s.name+" command", c.topic); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// definition returns the registered definition of typ at version.
func (o *Orchestrator) definition(typ string, version int) *def {
	o.mu.RLock()
	defer o.mu.RUnlock()
	return o.defs[typ][version]
}

// types returns the registered types and, per type, its versions.
func (o *Orchestrator) registered() map[string][]int {
	o.mu.RLock()
	defer o.mu.RUnlock()
	out := make(map[string][]int, len(o.defs))
	for t, vs := range o.defs {
		for v := range vs {
			out[t] = append(out[t], v)
		}
	}
	return out
}

// ReplyTopics returns the distinct reply topics of the registered
// definitions: subscribe the Handler to each.
func (o *Orchestrator) ReplyTopics() []string {
	o.mu.RLock()
	defer o.mu.RUnlock()
	seen := map[string]bool{}
	var out []string
	for _, vs := range o.defs {
		for _, d := range vs {
			if !seen[d.replyTopic] {
				seen[d.replyTopic] = true
				out = append(out, d.replyTopic)
			}
		}
	}
	return out
}

func (o *Orchestrator) callHook(ctx context.Context, p sagahook.Point, id string) error {
	if o.hook == nil {
		return nil
	}
	if err := o.hook(ctx, p, id); err != nil {
		return fmt.Errorf("saga %s: hook %s: %w", id, p, err)
	}
	return nil
}

// oneLine makes s storable in a text column and readable in a listing:
// valid UTF-8, no NUL, one line, at most about 2000 bytes.
func oneLine(s string) string {
	s = clean(s)
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 2000 {
		s = strings.ToValidUTF8(s[:2000], "")
	}
	return s
}

// clean makes s storable in a text column: valid UTF-8 without NUL.
func clean(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// StepInfo is one step of a registered definition, as DefinitionSteps
// lists it.
type StepInfo struct {
	Name  string
	Kind  Kind
	Group string // the step's parallel group, "" when it has none
}

// DefinitionSteps returns the steps of the registered definition of typ
// at version, in definition order (a parallel group's members are
// adjacent), and false when that version is not registered. Tools that
// draw a saga use it; it is safe for concurrent use.
func (o *Orchestrator) DefinitionSteps(typ string, version int) ([]StepInfo, bool) {
	d := o.definition(typ, version)
	if d == nil {
		return nil, false
	}
	out := make([]StepInfo, len(d.steps))
	for i, s := range d.steps {
		out[i] = StepInfo{Name: s.name, Kind: s.kind, Group: s.group}
	}
	return out, true
}
