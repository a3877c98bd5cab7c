package compensation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/poison"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// Config configures a Participant.
type Config struct {
	// Schema holds millrace's tables: the barrier, the outbox the replies
	// go to, the dedup marks. Defaults to "millrace".
	Schema string
	// Name names the participant ("payments"): the inbox consumer name of
	// the dedup middleware AddToRouter installs, and the participant label
	// of the metrics. Required.
	Name string
	// Writer writes the replies to the outbox. Defaults to a Writer on
	// Schema with default settings.
	Writer *outbox.Writer
	// Metrics, when set, registers the participants' Prometheus collector
	// with it: actions, compensations, empty compensations, late actions,
	// business failures, duplicates and poisoned commands by participant
	// and command, and the batch sizes (the package documentation lists
	// the series). Participants sharing a Registerer share the collector.
	// Defaults to nil: nothing counted.
	Metrics prometheus.Registerer
	// Logger receives business failures, late actions and empty
	// compensations at debug level, and the commands AddToRouter poisons
	// at error level, with the reason. Defaults to errors to
	// slog.Default() (outbox.DefaultLogger).
	Logger watermill.LoggerAdapter
}

// command is one registered command, its types erased.
type command struct {
	decode     func(payload []byte) (any, error)
	action     func(ctx context.Context, tx pgx.Tx, call Call, cmd any) ([]byte, error)
	compensate func(ctx context.Context, tx pgx.Tx, call Call, cmd any) error // nil: nothing to undo
}

// Participant handles the saga commands of one service: for each command
// registered with Register, it runs the action or its compensation behind
// the compensation barrier and replies through the outbox, all in the
// transaction of the inbox's dedup middleware (see the package
// documentation). It is safe for concurrent use; register its commands
// before it handles messages.
type Participant struct {
	pool    *pgxpool.Pool
	name    string
	writer  *outbox.Writer
	metrics *metrics
	logger  watermill.LoggerAdapter
	dedup   *inbox.Deduplicator
	sql     statements

	mu       sync.RWMutex
	commands map[string]*command
}

// NewParticipant returns a Participant. It does not touch the database.
func NewParticipant(pool *pgxpool.Pool, cfg Config) (*Participant, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: compensation: nil pool", core.ErrConfig)
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: compensation: %v", core.ErrConfig, err)
	}
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: compensation: Config.Name is required", core.ErrConfig)
	}
	dedup, err := inbox.NewDeduplicator(pool, inbox.DedupConfig{Schema: schema, Consumer: cfg.Name})
	if err != nil {
		return nil, fmt.Errorf("%w: compensation: Config.Name: %v", core.ErrConfig, err)
	}
	if cfg.Writer == nil {
		if cfg.Writer, err = outbox.NewWriter(pool, outbox.WriterConfig{Schema: schema}); err != nil {
			return nil, fmt.Errorf("%w: compensation: %v", core.ErrConfig, err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	var m *metrics
	if cfg.Metrics != nil {
		if m, err = registerMetrics(cfg.Metrics); err != nil {
			return nil, fmt.Errorf("%w: compensation.Config.Metrics: %v", core.ErrConfig, err)
		}
	}
	return &Participant{
		pool:     pool,
		name:     cfg.Name,
		writer:   cfg.Writer,
		metrics:  m,
		logger:   cfg.Logger.With(watermill.LogFields{"component": "compensation.Participant", "participant": cfg.Name}),
		dedup:    dedup,
		sql:      newStatements(schema),
		commands: map[string]*command{},
	}, nil
}

// Name returns the participant's name.
func (p *Participant) Name() string { return p.name }

// Register declares the command named name: its action, and the
// compensation that undoes it (nil when there is nothing to undo: a
// compensation command is then recorded as empty).
//
// The action runs the step's action in tx, the handler's transaction:
// write the effects with tx. It returns the reply data (encoded as JSON), a
// business failure (Fail), or a technical error (rolled back and retried).
// The compensation undoes, semantically, what the action did, in tx; the
// barrier runs it only when the action ran and succeeded, once (unless it
// returns a business failure, when a later attempt runs it again), with
// call.ActionReply holding the action's reply. It returns nil, a business
// failure (Fail), or a technical error.
// The command payload is
// decoded from JSON into Cmd (an empty payload gives Cmd's zero value); the
// action's Reply is encoded as JSON into the success reply. A compensation
// command carries the action's command name (MetadataSagaCommand) and
// payload, with MetadataSagaOperation "compensation".
//
// Go methods cannot have type parameters, so Register is a function.
// It refuses an empty name, a nil action or a name registered before, with
// an error wrapping core.ErrConfig.
func Register[Cmd, Reply any](p *Participant, name string,
	action func(ctx context.Context, tx pgx.Tx, call Call, cmd Cmd) (Reply, error),
	compensate func(ctx context.Context, tx pgx.Tx, call Call, cmd Cmd) error) error {
	if err := checkIdentifier(name, true); err != nil {
		return fmt.Errorf("%w: compensation: command name %q: %v", core.ErrConfig, name, err)
	}
	if action == nil {
		return fmt.Errorf("%w: compensation: command %q: nil action", core.ErrConfig, name)
	}
	c := &command{
		decode: func(payload []byte) (any, error) {
			var cmd Cmd
			if len(payload) == 0 {
				return cmd, nil
			}
			err := json.Unmarshal(payload, &cmd)
			return cmd, err
		},
		action: func(ctx context.Context, tx pgx.Tx, call Call, cmd any) ([]byte, error) {
			reply, err := action(ctx, tx, call, cmd.(Cmd))
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(reply)
			if err != nil {
				return nil, core.Permanent(fmt.Errorf("compensation: command %q: encode reply: %w", name, err))
			}
			return b, nil
		},
	}
	if compensate != nil {
		c.compensate = func(ctx context.Context, tx pgx.Tx, call Call, cmd any) error {
			return compensate(ctx, tx, call, cmd.(Cmd))
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.commands[name]; dup {
		return fmt.Errorf("%w: compensation: command %q registered twice", core.ErrConfig, name)
	}
	p.commands[name] = c
	return nil
}

// Handle handles one command message in a transaction of its own, with
// its inbox dedup mark (consumer: the participant's name), the barrier,
// the action or compensation and the reply: RunBatched's path for a batch
// of one. It is a Watermill NoPublishHandlerFunc for a Router the caller
// runs, behind PoisonQueue and Retry (AddToRouter does this wiring): a
// malformed command fails with a core.Permanent error (one that can be
// answered is answered first, as RunBatched does); a duplicate is
// acknowledged without effect.
func (p *Participant) Handle(msg *message.Message) error {
	bad, err := p.runBatch(msg.Context(), []*message.Message{msg})
	if err != nil {
		return err
	}
	return bad[msg.UUID]
}

// withTx returns ctx carrying tx, and puts tx in msg's context too until
// restore is called, so that the functions find the transaction where the
// inbox's handlers do (core.TxFromContext, the outbox's
// ContextPublisher).
func withTx(ctx context.Context, tx pgx.Tx, msgs ...*message.Message) (context.Context, func()) {
	if cur, ok := core.TxFromContext(ctx); !ok || cur != tx {
		ctx = core.ContextWithTx(ctx, tx)
	}
	var restores []func()
	for _, m := range msgs {
		orig := m.Context()
		if cur, ok := core.TxFromContext(orig); ok && cur == tx {
			continue
		}
		m.SetContext(core.ContextWithTx(orig, tx))
		restores = append(restores, func() { m.SetContext(orig) })
	}
	return ctx, func() {
		for _, r := range restores {
			r()
		}
	}
}

// item is one command message, parsed and decoded.
type item struct {
	msg  *message.Message
	call Call
	c    *command
	cmd  any
	// unsupported, if not empty, is why the command's protocol version
	// is refused (protocol.go).
	unsupported string
	// poisoned, if not empty, is why a command that can be answered (its
	// saga headers and reply topic are usable) cannot run: an unknown
	// command, a payload that does not decode. RunBatched and Handle
	// answer it with a failure (poisonedReason) and poison it too.
	poisoned string
}

// poisonedPrefix begins the reason of the failure reply to a poisoned
// command that can be answered (docs/protocol.md, "Malformed input").
const poisonedPrefix = "poisoned: "

// item parses and decodes msg; its errors are permanent. For a command
// that cannot run but can be answered (an unknown command, a payload that
// does not decode), it returns the item too, with poisoned set.
func (p *Participant) item(msg *message.Message) (*item, error) {
	call, err := parseCall(msg)
	if errors.Is(err, errUnsupportedProtocol) {
		return &item{msg: msg, call: call, unsupported: err.Error()}, nil // answered by refuseTx
	}
	if err != nil {
		return nil, err
	}
	// A reply the Writer refuses (a reply topic the transport does not
	// allow) would fail the same way on every retry.
	if err := p.writer.Validate(outbox.Event{Topic: call.ReplyTopic, PartitionKey: call.SagaID, Payload: emptyReply}); err != nil {
		return nil, invalid(msg, "metadata %s %q: the outbox refuses it as the reply's topic: %v", core.MetadataSagaReplyTopic, call.ReplyTopic, err)
	}
	p.mu.RLock()
	c := p.commands[call.Command]
	p.mu.RUnlock()
	if c == nil {
		err := core.Permanent(fmt.Errorf("%w: %q (message %q, participant %s)", ErrUnknownCommand, call.Command, msg.UUID, p.name))
		return &item{msg: msg, call: call, poisoned: err.Error()}, err
	}
	cmd, err := c.decode(msg.Payload)
	if err != nil {
		err := invalid(msg, "payload of command %q: %v", call.Command, err)
		return &item{msg: msg, call: call, poisoned: err.Error()}, err
	}
	return &item{msg: msg, call: call, c: c, cmd: cmd}, nil
}

// refusal is why a command is answered with a failure and nothing else
// (refuseTx): an unsupported protocol version, or a poisoned
// compensation (the barrier's rules need not keep it: a later
// compensation of the step runs whatever came before).
func (it *item) refusal() string {
	if it.poisoned != "" && it.call.Operation == core.OperationCompensation {
		return poisonedPrefix + it.poisoned
	}
	return it.unsupported
}

// claim is what the barrier's claim found: the operation's own row, and
// the action's row (for an action, the same row).
type claim struct {
	inserted        bool
	outcome, reason string
	reply           []byte

	actInserted bool
	actOutcome  string
	actReply    []byte
}

// reply is the answer to one command.
type reply struct {
	outcome, reason string
	payload         []byte
	// failed: a business failure; roll back to the savepoint before
	// finishing. finish: write outcome, empty, payload and reason to the
	// operation's barrier row.
	failed, finish, empty bool
}

var emptyReply = []byte("{}")

// decide answers a command from its claim, running the action or the
// compensation when the barrier lets it; beforeRun, if not nil, is called
// just before. A technical error of the function is returned.
func (p *Participant) decide(ctx context.Context, tx pgx.Tx, it *item, cl claim, beforeRun func()) (reply, error) {
	call := it.call
	stored := func(outcome, reason string, payload []byte) reply {
		if len(payload) == 0 {
			payload = emptyReply
		}
		return reply{outcome: outcome, reason: reason, payload: payload}
	}
	// run runs fn; count counts a run that did not fail technically. A
	// poisoned action does not run: it fails with the poison's reason,
	// stored in the barrier as that attempt's failure.
	run := func(count func(participant, command string), fn func() ([]byte, error)) (reply, error) {
		if it.poisoned != "" {
			return reply{outcome: core.OutcomeFailure, reason: cleanReason(poisonedPrefix + it.poisoned), payload: emptyReply, finish: true}, nil
		}
		if beforeRun != nil {
			beforeRun()
		}
		payload, err := fn()
		if err != nil {
			f, ok := asFailure(err)
			if !ok {
				return reply{}, err
			}
			count(p.name, call.Command)
			p.metrics.failure(p.name, call.Command, call.Operation)
			p.logger.Debug("Business failure", watermill.LogFields{"saga_id": call.SagaID, "step": call.Step, "operation": call.Operation, "reason": f.reason})
			return reply{outcome: core.OutcomeFailure, reason: cleanReason(f.reason), payload: emptyReply, failed: true, finish: true}, nil
		}
		count(p.name, call.Command)
		if payload == nil {
			payload = emptyReply
		}
		return reply{outcome: core.OutcomeSuccess, payload: payload, finish: true}, nil
	}

	if call.Operation == core.OperationAction {
		switch {
		case cl.inserted:
			return run(p.metrics.action, func() ([]byte, error) { return it.c.action(ctx, tx, call, it.cmd) })
		case cl.outcome == core.OutcomeCancelled:
			p.metrics.late(p.name, call.Command)
			p.logger.Debug("Late action cancelled", watermill.LogFields{"saga_id": call.SagaID, "step": call.Step, "attempt": call.Attempt})
			return stored(cl.outcome, cl.reason, nil), nil
		case cl.outcome == core.OutcomeSuccess, cl.outcome == core.OutcomeFailure:
			p.metrics.duplicate(p.name, call.Command, call.Operation)
			return stored(cl.outcome, cl.reason, cl.reply), nil
		}
		return reply{}, fmt.Errorf("compensation: %s: action %s/%s has outcome %q in the barrier", p.name, call.SagaID, call.Step, cl.outcome)
	}

	if !cl.inserted && cl.outcome == core.OutcomeSuccess {
		// Compensated before: the same answer again.
		p.metrics.duplicate(p.name, call.Command, call.Operation)
		return stored(cl.outcome, "", cl.reply), nil
	}
	switch cl.actOutcome {
	case core.OutcomeSuccess:
		if cl.actInserted {
			break // cannot happen: an inserted action row is cancelled
		}
		if it.c.compensate == nil {
			p.metrics.compensation(p.name, call.Command)
			return reply{outcome: core.OutcomeSuccess, payload: emptyReply, finish: true}, nil
		}
		call.ActionReply = cl.actReply
		return run(p.metrics.compensation, func() ([]byte, error) { return nil, it.c.compensate(ctx, tx, call, it.cmd) })
	case core.OutcomeCancelled, core.OutcomeFailure:
		// Empty: the action never ran (its row now blocks it), or it failed
		// and had no effect.
		p.metrics.empty(p.name, call.Command)
		p.logger.Debug("Empty compensation", watermill.LogFields{"saga_id": call.SagaID, "step": call.Step, "action_outcome": cl.actOutcome})
		return reply{outcome: core.OutcomeSuccess, payload: emptyReply, finish: true, empty: true}, nil
	}
	return reply{}, fmt.Errorf("compensation: %s: action %s/%s has outcome %q in the barrier", p.name, call.SagaID, call.Step, cl.actOutcome)
}

// lateReason is the reason of the cancelled reply to a late action.
const lateReason = "compensated before the action arrived"

// replyEventType is the outbox event type of replies.
const replyEventType = "saga.reply"

// replyEvent is the outbox event of r.
func (p *Participant) replyEvent(call Call, r reply) outbox.Event {
	md := map[string]string{
		core.MetadataSagaID:        call.SagaID,
		core.MetadataSagaType:      call.SagaType,
		core.MetadataSagaStep:      call.Step,
		core.MetadataSagaAttempt:   strconv.Itoa(call.Attempt),
		core.MetadataSagaOperation: call.Operation,
		core.MetadataSagaCommand:   call.Command,
		core.MetadataSagaOutcome:   r.outcome,
		core.MetadataContentType:   core.ContentTypeJSON,
		core.MetadataSagaProtocol:  core.SagaProtocolVersion,
	}
	if r.reason != "" {
		md[core.MetadataSagaReason] = r.reason
	}
	return outbox.Event{
		Topic:         call.ReplyTopic,
		PartitionKey:  call.SagaID,
		AggregateType: call.SagaType,
		AggregateID:   call.SagaID,
		EventType:     replyEventType,
		Payload:       r.payload,
		Metadata:      md,
	}
}

// RouterConfig says how AddToRouter wires a participant into a Router.
type RouterConfig struct {
	// Topic is the command topic to consume. Required.
	Topic string
	// Subscriber reads Topic. Required.
	Subscriber message.Subscriber
	// Poison receives the messages that fail permanently (bad metadata, an
	// unknown command, a payload that does not decode, a reply topic the
	// Writer refuses), with the reason in metadata "reason_poisoned" and
	// the command topic in "topic_poisoned"; each is logged at error level
	// with the reason (Config.Logger) and counted (Metrics, poisoned_total).
	// Other failures are nacked for redelivery. Required: a bad command
	// must not be lost. The millrace command's "poison" commands and the
	// console list a poison topic on Kafka and requeue its messages.
	Poison message.Publisher
	// PoisonTopic is the topic of Poison. Defaults to Topic + ".poison".
	PoisonTopic string
	// Retry retries failed handler runs in process, each in a fresh
	// transaction. Defaults to 5 retries from 100ms, doubling up to 5s,
	// skipping permanent errors (inbox.ShouldRetry).
	Retry *middleware.Retry
	// HandlerName names the Router handler. Defaults to the participant's
	// name, a dot, and Topic.
	HandlerName string
}

// AddToRouter adds Handle for the participant's commands on cfg.Topic to
// r, behind PoisonQueue (permanent failures only) and Retry, in that
// order: each try is one transaction with the dedup mark, the barrier, the
// effects and the reply. Call it once per command topic. It is for a
// Router the caller runs; the service runner (millrace.Service) runs
// RunBatched instead, many commands per transaction.
func (p *Participant) AddToRouter(r *message.Router, cfg RouterConfig) (*message.Handler, error) {
	switch {
	case r == nil:
		return nil, fmt.Errorf("%w: compensation: nil router", core.ErrConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: compensation: RouterConfig.Topic is required", core.ErrConfig)
	case cfg.Subscriber == nil:
		return nil, fmt.Errorf("%w: compensation: RouterConfig.Subscriber is required", core.ErrConfig)
	case cfg.Poison == nil:
		return nil, fmt.Errorf("%w: compensation: RouterConfig.Poison is required", core.ErrConfig)
	}
	if cfg.PoisonTopic == "" {
		cfg.PoisonTopic = cfg.Topic + ".poison"
	}
	if cfg.HandlerName == "" {
		cfg.HandlerName = p.name + "." + cfg.Topic
	}
	retry := middleware.Retry{MaxRetries: 5, InitialInterval: 100 * time.Millisecond, MaxInterval: 5 * time.Second,
		Multiplier: 2, ShouldRetry: inbox.ShouldRetry}
	if cfg.Retry != nil {
		retry = *cfg.Retry
	}
	poisonPub := poison.Publisher(cfg.Poison, p.logger, func(*message.Message) { p.metrics.poisoned(p.name) })
	poison, err := middleware.PoisonQueueWithFilter(poisonPub, cfg.PoisonTopic, core.IsPermanent)
	if err != nil {
		return nil, fmt.Errorf("%w: compensation: %v", core.ErrConfig, err)
	}
	h := r.AddConsumerHandler(cfg.HandlerName, cfg.Topic, cfg.Subscriber, p.Handle)
	h.AddMiddleware(poison, retry.Middleware)
	return h, nil
}
