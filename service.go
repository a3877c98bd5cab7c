package millrace

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/kafkalag"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/retention"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// DefaultSchema is the schema of millrace's tables when Config.Schema is
// empty.
const DefaultSchema = "millrace"

// Config configures a Service. Only Name is always required; Brokers is
// required unless Publisher (or NoRelay) and Subscriber are set, and
// Subscriber only when the service consumes (sagas or participants). Every part the Service
// builds (the outbox Writer, the relay, the orchestrator, the
// participants, retention) takes its schema, publisher, logger and
// metrics from here.
type Config struct {
	// Name names the service ("orders"): the Kafka consumer group of the
	// default Subscriber, the "service" label of the metrics, and the
	// first word of the errors Run returns. Required.
	Name string
	// Schema holds millrace's tables (migrate them with package
	// migrations first). Defaults to DefaultSchema.
	Schema string
	// Brokers are the Kafka brokers of the default Publisher and
	// Subscriber.
	Brokers []string
	// Publisher is where the relay ships the outbox. Defaults to a
	// kafka.Publisher on Brokers, closed when Run returns.
	Publisher message.Publisher
	// Subscriber reads the reply and command topics. Defaults to a
	// kafka.Subscriber on Brokers in consumer group Name, from the oldest
	// offset when the group has none, closed when Run returns: it
	// delivers whole fetches, which the orchestrator and the participants
	// apply many per transaction. Any message.Subscriber works; one that
	// delivers a message at a time (watermill-kafka's delivers one per
	// partition, the next after the previous is acknowledged) limits a
	// transaction to one message per partition.
	Subscriber message.Subscriber
	// Logger receives the errors of every part. Defaults to errors to
	// slog.Default(); watermill.NopLogger{} silences it.
	Logger watermill.LoggerAdapter
	// Metrics, when set, registers the Prometheus collectors of the
	// relay, the orchestrator and the participants, labelled with the
	// service's Name, and with Brokers the lag of its consumer group per
	// partition (millrace_kafka_consumer_lag, _oldest_age_seconds,
	// _stalled, _assigned: a partition nobody consumes shows before its
	// sagas' steps time out). Defaults to nil: nothing is counted.
	Metrics prometheus.Registerer
	// Saga tunes the orchestrator (Service.Orchestrator). Its Schema,
	// Writer, Logger and Metrics default to the service's; a Schema other
	// than the service's is refused (the relay would not ship the saga's
	// commands). Defaults to saga.Config's defaults.
	Saga saga.Config
	// Relay tunes the relay. Its Schema, Publisher, Logger and Metrics
	// default to the service's; a Schema or a Publisher other than the
	// service's is refused. Defaults to outbox.RelayConfig's defaults.
	Relay outbox.RelayConfig
	// NoRelay leaves the relay out: another process ships this schema's
	// outbox. Defaults to false.
	NoRelay bool
	// Retention says how long ended rows stay. Defaults to Retention's
	// defaults.
	Retention Retention
}

// ErrRunTwice is returned by a second call of Run, and by Run after Close.
var ErrRunTwice = errors.New("millrace: Run was called already")

// Service is everything one millrace service runs, started by one call of
// Run: the outbox relay, the orchestrator's replies and timers, the
// participants' commands, and retention. Build it with New, register the
// saga definitions on Orchestrator and add the participants with
// AddParticipant, then Run it. It is safe for concurrent use.
type Service struct {
	name   string
	schema string
	pool   *pgxpool.Pool
	logger watermill.LoggerAdapter

	writer  *outbox.Writer
	relay   *outbox.Relay
	orch    *saga.Orchestrator
	sub     message.Subscriber
	poison  message.Publisher
	cleaner *retention.Cleaner
	metrics prometheus.Registerer // nil: none

	mu           sync.Mutex
	participants []participant
	owned        []interface{ Close() error } // the publisher and subscriber New made
	ran          atomic.Bool
}

// participant is a participant and the command topics it consumes.
type participant struct {
	p      *compensation.Participant
	topics []string
}

// New returns a Service on pool, built from cfg: it validates cfg and
// builds every part. It does not touch the database; the default
// Publisher and Subscriber connect to Brokers, and New fails when none
// answers. Configuration errors wrap core.ErrConfig.
func New(pool *pgxpool.Pool, cfg Config) (_ *Service, err error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: millrace: nil pool", core.ErrConfig)
	}
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: millrace: Config.Name is required", core.ErrConfig)
	}
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if _, err := sqlident.Schema(cfg.Schema); err != nil {
		return nil, fmt.Errorf("%w: service %s: Config.Schema: %v", core.ErrConfig, cfg.Name, err)
	}
	if err := inherit(cfg.Name, "Saga", &cfg.Saga.Schema, cfg.Schema); err != nil {
		return nil, err
	}
	if err := inherit(cfg.Name, "Relay", &cfg.Relay.Schema, cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Relay.Publisher != nil && cfg.Publisher != nil && cfg.Relay.Publisher != cfg.Publisher {
		return nil, fmt.Errorf("%w: service %s: Config.Relay.Publisher differs from Config.Publisher: set Config.Publisher only", core.ErrConfig, cfg.Name)
	}
	if cfg.Publisher == nil {
		cfg.Publisher = cfg.Relay.Publisher
	}
	if len(cfg.Brokers) == 0 && cfg.Publisher == nil && !cfg.NoRelay {
		return nil, fmt.Errorf("%w: service %s: Config.Brokers is required without a Publisher", core.ErrConfig, cfg.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = logging.Default()
	}
	s := &Service{name: cfg.Name, schema: cfg.Schema, pool: pool, sub: cfg.Subscriber,
		logger: cfg.Logger.With(watermill.LogFields{"component": "millrace.Service", "service": cfg.Name})}
	defer func() {
		if err != nil {
			s.closeOwned()
		}
	}()
	if s.writer, err = outbox.NewWriter(pool, outbox.WriterConfig{Schema: cfg.Schema}); err != nil {
		return nil, fmt.Errorf("service %s: %w", cfg.Name, err)
	}
	s.poison = newPoisonPublisher(pool, s.writer)
	if s.metrics, err = s.registerMetrics(cfg); err != nil {
		return nil, err
	}

	if !cfg.NoRelay {
		if cfg.Publisher == nil {
			pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cfg.Brokers}, cfg.Logger)
			if err != nil {
				return nil, fmt.Errorf("service %s: Kafka publisher: %w", cfg.Name, err)
			}
			s.owned = append(s.owned, pub)
			cfg.Publisher = pub
		}
		rc := cfg.Relay
		rc.Publisher = cfg.Publisher
		rc.Logger = cmpLogger(rc.Logger, cfg.Logger)
		if rc.Metrics == nil {
			rc.Metrics = s.metrics
		}
		if s.relay, err = outbox.NewRelay(pool, rc); err != nil {
			return nil, fmt.Errorf("service %s: relay: %w", cfg.Name, err)
		}
	}
	if s.sub == nil && len(cfg.Brokers) > 0 {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: cfg.Brokers, ConsumerGroup: cfg.Name}, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("service %s: Kafka subscriber: %w", cfg.Name, err)
		}
		s.owned = append(s.owned, sub)
		s.sub = sub
	}

	sc := cfg.Saga
	if sc.Writer == nil {
		sc.Writer = s.writer
	}
	sc.Logger = cmpLogger(sc.Logger, cfg.Logger)
	if sc.Metrics == nil {
		sc.Metrics = s.metrics
	}
	if s.orch, err = saga.New(pool, sc); err != nil {
		return nil, fmt.Errorf("service %s: %w", cfg.Name, err)
	}

	if !cfg.Retention.Off {
		if s.cleaner, err = retention.New(pool, cfg.Retention.config(cfg.Schema, cfg.Logger)); err != nil {
			return nil, fmt.Errorf("service %s: retention: %w", cfg.Name, err)
		}
	}
	return s, nil
}

// inherit sets a part's schema to the service's, or refuses one that
// differs.
func inherit(service, part string, schema *string, want string) error {
	if *schema != "" && *schema != want {
		return fmt.Errorf("%w: service %s: Config.%s.Schema is %q, the service's is %q: leave it empty (the relay ships the service's schema only)",
			core.ErrConfig, service, part, *schema, want)
	}
	*schema = want
	return nil
}

func cmpLogger(l, def watermill.LoggerAdapter) watermill.LoggerAdapter {
	if l == nil {
		return def
	}
	return l
}

// registerMetrics returns the Registerer the Service's parts register
// their collectors with (cfg.Metrics, labelled with the service's name),
// and registers there what no part registers itself: its consumer group's
// lag and the audit trail's counter. It returns nil without cfg.Metrics.
func (s *Service) registerMetrics(cfg Config) (prometheus.Registerer, error) {
	if cfg.Metrics == nil {
		return nil, nil
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"service": cfg.Name}, cfg.Metrics)
	if len(cfg.Brokers) > 0 {
		lag, err := kafkalag.New(kafkalag.Config{Brokers: cfg.Brokers, Groups: []string{cfg.Name}})
		if err != nil {
			return nil, fmt.Errorf("service %s: lag reader: %w", cfg.Name, err)
		}
		s.owned = append(s.owned, closer(lag.Close))
		if err := reg.Register(lag.Collector()); err != nil {
			return nil, fmt.Errorf("%w: service %s: register metrics: %v", core.ErrConfig, cfg.Name, err)
		}
	}
	// The operator actions this process records (internal/audit).
	if err := audit.Register(reg); err != nil {
		return nil, fmt.Errorf("%w: service %s: register metrics: %v", core.ErrConfig, cfg.Name, err)
	}
	return reg, nil
}

// Orchestrator returns the service's saga orchestrator: register the saga
// definitions it runs on it before Run, and start sagas with
// saga.Start or saga.StartTx.
func (s *Service) Orchestrator() *saga.Orchestrator { return s.orch }

// Writer returns the service's outbox Writer: write the service's own
// events with it, in the business transaction (Writer.WriteTx). Its
// wake-ups of the relay are coalesced with the saga's and the
// participants'.
func (s *Service) Writer() *outbox.Writer { return s.writer }

// AddParticipant returns a new saga participant named name, which handles
// the commands of topics: register its commands on it
// (compensation.Register) before Run. The name is its inbox consumer: a
// participant keeps its name across restarts and instances. It fails after
// Run has started, for a name given before, and without topics.
func (s *Service) AddParticipant(name string, topics ...string) (*compensation.Participant, error) {
	if len(topics) == 0 || slices.Contains(topics, "") {
		return nil, fmt.Errorf("%w: service %s: participant %q: a command topic is required", core.ErrConfig, s.name, name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ran.Load() {
		return nil, fmt.Errorf("%w: service %s: participant %q added after Run", core.ErrConfig, s.name, name)
	}
	for _, p := range s.participants {
		if p.p.Name() == name {
			return nil, fmt.Errorf("%w: service %s: participant %q added twice", core.ErrConfig, s.name, name)
		}
	}
	p, err := compensation.NewParticipant(s.pool, compensation.Config{Schema: s.schema, Name: name, Writer: s.writer,
		Metrics: s.metrics, Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("service %s: %w", s.name, err)
	}
	s.participants = append(s.participants, participant{p: p, topics: slices.Clone(topics)})
	return p, nil
}

// part is a long-running piece of the service.
type part struct {
	name string
	run  func(ctx context.Context) error
}

// parts returns the service's parts, in the stages they stop in: first
// what consumes (the orchestrator's replies, the participants' commands),
// then the timers, then retention, then the relay.
func (s *Service) parts() ([][]part, error) {
	var consumers []part
	if len(s.orch.ReplyTopics()) > 0 {
		consumers = append(consumers, part{"saga replies", func(ctx context.Context) error {
			return s.orch.RunBatched(ctx, saga.BatchConfig{Subscriber: s.sub, Poison: s.poison})
		}})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.participants {
		for _, topic := range p.topics {
			consumers = append(consumers, part{"participant " + p.p.Name() + " on " + topic, func(ctx context.Context) error {
				return p.p.RunBatched(ctx, compensation.RunConfig{Subscriber: s.sub, Topic: topic, Poison: s.poison})
			}})
		}
	}
	if len(consumers) > 0 && s.sub == nil {
		return nil, fmt.Errorf("%w: service %s: Config.Brokers or Config.Subscriber is required to consume", core.ErrConfig, s.name)
	}
	stages := [][]part{consumers}
	if len(s.orch.ReplyTopics()) > 0 {
		stages = append(stages, []part{{"saga timers", s.orch.Run}})
	}
	if s.cleaner != nil {
		stages = append(stages, []part{{"retention", s.cleaner.Run}})
	}
	if s.relay != nil {
		stages = append(stages, []part{{"relay", s.relay.Run}})
	}
	return stages, nil
}

// Run runs every part of the service until ctx ends or a part fails, then
// stops them in order: first what consumes (which finishes the batches in
// hand), then the timers, then retention, then the relay (last, so that
// what the others wrote while stopping is still shipped while it runs),
// and closes the publisher and subscriber New made. It returns nil when
// ctx ended, or the first failure, naming the part ("service orders:
// relay: ..."): a part fails when it cannot start (the relay's tables are
// missing, a topic cannot be subscribed to) or stops on its own; a
// second part failing meanwhile is logged. Failures the parts retry (a
// broker or database outage) are logged, not returned. Run may be called
// once.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	ran := s.ran.Swap(true)
	s.mu.Unlock()
	if ran {
		return ErrRunTwice
	}
	defer s.closeOwned()
	stages, err := s.parts()
	if err != nil {
		return err
	}
	failed := make(chan error, 1)
	stopping := make(chan struct{})
	type running struct {
		cancel context.CancelFunc
		done   *sync.WaitGroup
	}
	run := make([]running, len(stages))
	// Parts run on a context that keeps ctx's values but ends only when
	// Run stops their stage.
	base := context.WithoutCancel(ctx)
	for i := len(stages) - 1; i >= 0; i-- { // the relay first
		pctx, cancel := context.WithCancel(base)
		wg := &sync.WaitGroup{}
		run[i] = running{cancel, wg}
		for _, p := range stages[i] {
			wg.Go(func() {
				err := p.run(pctx)
				if pctx.Err() != nil && err == nil {
					return // stopped
				}
				if err == nil {
					err = errors.New("stopped on its own")
				}
				err = fmt.Errorf("service %s: %s: %w", s.name, p.name, err)
				select {
				case <-stopping:
					if pctx.Err() == nil {
						s.logger.Error("part failed while the service stopped", err, nil)
					}
					return
				default:
				}
				select {
				case failed <- err:
				default:
					s.logger.Error("part failed too", err, nil)
				}
			})
		}
	}
	select {
	case <-ctx.Done():
	case err = <-failed:
		s.logger.Error("part failed; stopping the service", err, nil)
	}
	close(stopping)
	for _, r := range run {
		r.cancel()
		r.done.Wait()
	}
	return err
}

// Close closes the publisher and subscriber New made, for a Service that
// is not run (Run closes them when it returns). Run fails after Close.
func (s *Service) Close() error {
	s.mu.Lock()
	s.ran.Store(true)
	s.mu.Unlock()
	return s.closeOwned()
}

func (s *Service) closeOwned() error {
	s.mu.Lock()
	owned := s.owned
	s.owned = nil
	s.mu.Unlock()
	var errs []error
	for i := len(owned) - 1; i >= 0; i-- {
		if err := owned[i].Close(); err != nil {
			s.logger.Error("close", err, nil)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// closer makes a Close without an error a Close with one.
type closer func()

func (c closer) Close() error { c(); return nil }
