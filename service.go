package millrace

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// Config configures a Service.
type Config struct {
	// Name names the service ("orders"): the Kafka consumer group of the
	// default Subscriber, and the first word of the errors Run returns.
	// Required.
	Name string
	// Schema holds millrace's tables (migrate them with package
	// migrations first). The Orchestrator and the Participants must use
	// the same one, or the relay does not ship what they write. Defaults
	// to "millrace".
	Schema string
	// Brokers are the Kafka brokers of the default Publisher and
	// Subscriber. Required unless Publisher is set, and Subscriber too
	// when the service has an Orchestrator or Participants.
	Brokers []string
	// Publisher is where the relay ships the outbox. Defaults to a
	// kafka.Publisher on Brokers, closed when Run returns.
	Publisher message.Publisher
	// Subscriber reads the reply and command topics. Defaults to a
	// kafka.Subscriber on Brokers in consumer group Name (from the oldest
	// offset when the group has none), closed when Run returns.
	Subscriber message.Subscriber
	// Writer is the outbox Writer the poisoned messages go through.
	// Defaults to a new outbox.Writer on Schema. Give the same Writer to
	// saga.Config.Writer and compensation.Config.Writer, so that the
	// service's wake-ups to the relay are coalesced.
	Writer *outbox.Writer
	// Orchestrator, when set, has its replies handled (in a Router, one
	// transaction per reply, or with Batch many per transaction) and its
	// timers fired (Orchestrator.Run). Register its definitions before
	// New. Defaults to nil: no sagas start here.
	Orchestrator *saga.Orchestrator
	// Batch, when set, has the Orchestrator apply its replies with
	// RunBatched instead of in the Router; its Subscriber and Poison
	// default to this Config's. Defaults to nil.
	Batch *saga.BatchConfig
	// Participants are the saga participants whose commands the service
	// handles, one entry per command topic. Defaults to none.
	Participants []Participant
	// Poison receives the messages that fail permanently (not a saga
	// reply, an unknown command, a payload that does not decode), on the
	// message's topic + ".poison", with the reason in metadata
	// "reason_poisoned". Defaults to the service's own outbox: each
	// poisoned message is written with Writer in a transaction of its
	// own, and acknowledged only after that commits; the relay ships it
	// like any event. See PoisonPublisher.
	Poison message.Publisher
	// Retry retries failed handler runs in the Router in process, each in
	// a fresh transaction. Defaults to the default of saga.RouterConfig
	// and compensation.RouterConfig: 5 retries from 100ms, doubling up to
	// 5s, skipping permanent errors.
	Retry *middleware.Retry
	// Relay configures the relay. Its Schema and Publisher are this
	// Config's (leave them empty there); its Logger defaults to Logger.
	// Defaults to outbox.RelayConfig's defaults.
	Relay outbox.RelayConfig
	// NoRelay leaves the relay out: another process ships this schema's
	// outbox. Defaults to false.
	NoRelay bool
	// Cleaners configures the retention jobs. Defaults to running an
	// outbox.Cleaner and an inbox.Cleaner, a compensation.Cleaner when
	// the service has Participants, and a saga.Cleaner when it has an
	// Orchestrator, each with its own defaults (7 days, a pass a minute;
	// compensated and once-stuck sagas 30 days).
	Cleaners Cleaners
	// Logger receives the errors of the parts and of the Router. Defaults
	// to outbox.DefaultLogger(): errors to slog.Default().
	Logger watermill.LoggerAdapter
}

// Participant is a participant and the command topic it handles.
type Participant struct {
	// Participant runs the commands. Register its commands before New.
	// Required.
	Participant *compensation.Participant
	// Router says how it is wired into the service's Router
	// (compensation.Participant.AddToRouter). Topic is required;
	// Subscriber, Poison and Retry default to the service's.
	Router compensation.RouterConfig
}

// Cleaners configures the retention jobs a Service runs.
type Cleaners struct {
	// Disabled runs none of them (run them elsewhere). Defaults to false.
	Disabled bool
	// Outbox configures the outbox.Cleaner; its Schema is the service's
	// and its Logger defaults to the service's.
	Outbox outbox.CleanerConfig
	// Inbox configures the inbox.Cleaner; its Schema is the service's
	// and its Logger defaults to the service's.
	Inbox inbox.CleanerConfig
	// Compensation configures the compensation.Cleaner, run when the
	// service has Participants; its Schema is the service's and its
	// Logger defaults to the service's.
	Compensation compensation.CleanerConfig
	// Saga configures the saga.Cleaner, run when the service has an
	// Orchestrator; its Schema is the service's and its Logger defaults
	// to the service's. It removes only completed and compensated sagas.
	Saga saga.CleanerConfig
}

// ErrRunTwice is returned by a second call of Run.
var ErrRunTwice = errors.New("service: Run was called already")

// Service is everything one millrace service runs, started by one call of
// Run: the outbox relay, the Orchestrator's reply handlers and timers,
// the Participants' command handlers, and the cleaners. It is safe for
// concurrent use; Run may be called once.
type Service struct {
	name   string
	logger watermill.LoggerAdapter

	relay    *outbox.Relay
	orch     *saga.Orchestrator
	batch    *saga.BatchConfig
	router   *message.Router // nil: nothing to consume in a Router
	cleaners []part

	owned []interface{ Close() error } // the publisher and subscriber New made
	ran   atomic.Bool
}

// part is a long-running piece of the service.
type part struct {
	name string
	run  func(ctx context.Context) error
}

// New returns a Service on pool, built from cfg: it validates cfg and
// builds every part. It does not touch the database; the default
// Publisher (kafka.NewPublisher) connects to Brokers, and New fails when
// none answers. Configuration errors wrap core.ErrConfig.
func New(pool *pgxpool.Pool, cfg Config) (_ *Service, err error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: service: nil pool", core.ErrConfig)
	}
	if cfg.Name == "" {
		return nil, fmt.Errorf("%w: service: Config.Name is required", core.ErrConfig)
	}
	if cfg.Batch != nil && cfg.Orchestrator == nil {
		return nil, fmt.Errorf("%w: service %s: Config.Batch needs an Orchestrator", core.ErrConfig, cfg.Name)
	}
	if cfg.Relay.Schema != "" || cfg.Relay.Publisher != nil {
		return nil, fmt.Errorf("%w: service %s: set Config.Schema and Config.Publisher, not those of Config.Relay", core.ErrConfig, cfg.Name)
	}
	consumes := cfg.Orchestrator != nil || len(cfg.Participants) > 0
	if len(cfg.Brokers) == 0 && (cfg.Publisher == nil && !cfg.NoRelay || cfg.Subscriber == nil && consumes) {
		return nil, fmt.Errorf("%w: service %s: Config.Brokers is required without a Publisher and a Subscriber", core.ErrConfig, cfg.Name)
	}
	if cfg.Logger == nil {
		cfg.Logger = outbox.DefaultLogger()
	}
	s := &Service{name: cfg.Name, orch: cfg.Orchestrator, batch: cfg.Batch,
		logger: cfg.Logger.With(watermill.LogFields{"component": "service.Service", "service": cfg.Name})}
	defer func() {
		if err != nil {
			s.closeOwned()
		}
	}()
	if cfg.Writer == nil {
		if cfg.Writer, err = outbox.NewWriter(pool, outbox.WriterConfig{Schema: cfg.Schema}); err != nil {
			return nil, fmt.Errorf("service %s: %w", cfg.Name, err)
		}
	}
	if cfg.Poison == nil {
		cfg.Poison = PoisonPublisher(pool, cfg.Writer)
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
		rc.Schema, rc.Publisher = cfg.Schema, cfg.Publisher
		if rc.Logger == nil {
			rc.Logger = cfg.Logger
		}
		if s.relay, err = outbox.NewRelay(pool, rc); err != nil {
			return nil, fmt.Errorf("service %s: relay: %w", cfg.Name, err)
		}
	}

	if consumes && cfg.Subscriber == nil {
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:       cfg.Brokers,
			ConsumerGroup: cfg.Name,
			InitialOffset: kafka.OffsetOldest,
		}, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("%w: service %s: Kafka subscriber: %v", core.ErrConfig, cfg.Name, err)
		}
		s.owned = append(s.owned, sub)
		cfg.Subscriber = sub
	}
	if cfg.Batch != nil {
		b := *cfg.Batch
		if b.Subscriber == nil {
			b.Subscriber = cfg.Subscriber
		}
		if b.Poison == nil {
			b.Poison = cfg.Poison
		}
		if len(cfg.Orchestrator.ReplyTopics()) == 0 {
			return nil, fmt.Errorf("%w: service %s: the Orchestrator has no definitions registered", core.ErrConfig, cfg.Name)
		}
		s.batch = &b
	}
	if cfg.Orchestrator != nil && cfg.Batch == nil || len(cfg.Participants) > 0 {
		if s.router, err = message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, cfg.Logger); err != nil {
			return nil, fmt.Errorf("%w: service %s: router: %v", core.ErrConfig, cfg.Name, err)
		}
	}
	if cfg.Orchestrator != nil && cfg.Batch == nil {
		if _, err := cfg.Orchestrator.AddToRouter(s.router, saga.RouterConfig{
			Subscriber: cfg.Subscriber, Poison: cfg.Poison, Retry: cfg.Retry}); err != nil {
			return nil, fmt.Errorf("service %s: %w", cfg.Name, err)
		}
	}
	for i, p := range cfg.Participants {
		if p.Participant == nil {
			return nil, fmt.Errorf("%w: service %s: Participants[%d].Participant is nil", core.ErrConfig, cfg.Name, i)
		}
		rc := p.Router
		if rc.Subscriber == nil {
			rc.Subscriber = cfg.Subscriber
		}
		if rc.Poison == nil {
			rc.Poison = cfg.Poison
		}
		if rc.Retry == nil {
			rc.Retry = cfg.Retry
		}
		if _, err := p.Participant.AddToRouter(s.router, rc); err != nil {
			return nil, fmt.Errorf("service %s: participant %s: %w", cfg.Name, p.Participant.Name(), err)
		}
	}

	if !cfg.Cleaners.Disabled {
		if err := s.addCleaners(pool, cfg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Service) addCleaners(pool *pgxpool.Pool, cfg Config) error {
	oc := cfg.Cleaners.Outbox
	oc.Schema = cfg.Schema
	if oc.Logger == nil {
		oc.Logger = cfg.Logger
	}
	c, err := outbox.NewCleaner(pool, oc)
	if err != nil {
		return fmt.Errorf("service %s: outbox cleaner: %w", cfg.Name, err)
	}
	s.cleaners = append(s.cleaners, part{"outbox cleaner", c.Run})
	ic := cfg.Cleaners.Inbox
	ic.Schema = cfg.Schema
	if ic.Logger == nil {
		ic.Logger = cfg.Logger
	}
	ci, err := inbox.NewCleaner(pool, ic)
	if err != nil {
		return fmt.Errorf("service %s: inbox cleaner: %w", cfg.Name, err)
	}
	s.cleaners = append(s.cleaners, part{"inbox cleaner", ci.Run})
	if len(cfg.Participants) > 0 {
		cc := cfg.Cleaners.Compensation
		cc.Schema = cfg.Schema
		if cc.Logger == nil {
			cc.Logger = cfg.Logger
		}
		cb, err := compensation.NewCleaner(pool, cc)
		if err != nil {
			return fmt.Errorf("service %s: compensation cleaner: %w", cfg.Name, err)
		}
		s.cleaners = append(s.cleaners, part{"compensation cleaner", cb.Run})
	}
	if cfg.Orchestrator != nil {
		sc := cfg.Cleaners.Saga
		sc.Schema = cfg.Schema
		if sc.Logger == nil {
			sc.Logger = cfg.Logger
		}
		cs, err := saga.NewCleaner(pool, sc)
		if err != nil {
			return fmt.Errorf("service %s: saga cleaner: %w", cfg.Name, err)
		}
		s.cleaners = append(s.cleaners, part{"saga cleaner", cs.Run})
	}
	return nil
}

// Run runs every part of the service until ctx ends or a part fails, then
// stops them in order: first what consumes (the Router, which finishes the
// messages in hand, and the batched replies), then the timers, then the
// cleaners, then the relay (last, so that what the others wrote while
// stopping is still shipped while it runs), and closes the publisher and
// subscriber New made. It returns nil when ctx ended, or the first
// failure, naming the part ("service orders: relay: ..."): a part fails
// when it cannot start (the relay's tables are missing, the Router cannot
// subscribe) or stops on its own. Failures the parts retry (a broker or
// database outage) are logged, not returned. Run may be called once.
func (s *Service) Run(ctx context.Context) error {
	if !s.ran.CompareAndSwap(false, true) {
		return ErrRunTwice
	}
	defer s.closeOwned()
	// The stages, in the order they stop.
	var stages [][]part
	var consumers []part
	if s.router != nil {
		r := s.router
		consumers = append(consumers, part{"router", func(ctx context.Context) error {
			stop := context.AfterFunc(ctx, func() { _ = r.Close() })
			defer stop()
			return r.Run(ctx)
		}})
	}
	if s.batch != nil {
		b := *s.batch
		consumers = append(consumers, part{"saga replies", func(ctx context.Context) error { return s.orch.RunBatched(ctx, b) }})
	}
	stages = append(stages, consumers)
	if s.orch != nil {
		stages = append(stages, []part{{"saga timers", s.orch.Run}})
	}
	stages = append(stages, s.cleaners)
	if s.relay != nil {
		stages = append(stages, []part{{"relay", s.relay.Run}})
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
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := p.run(pctx)
				if pctx.Err() != nil && err == nil {
					return // stopped
				}
				select {
				case <-stopping:
					if err != nil && pctx.Err() == nil {
						s.logger.Error("part failed while the service stopped", err, watermill.LogFields{"part": p.name})
					}
					return
				default:
				}
				if err == nil {
					err = errors.New("stopped on its own")
				}
				select {
				case failed <- fmt.Errorf("service %s: %s: %w", s.name, p.name, err):
				default:
				}
			}()
		}
	}
	var err error
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

func (s *Service) closeOwned() {
	for i := len(s.owned) - 1; i >= 0; i-- {
		if err := s.owned[i].Close(); err != nil {
			s.logger.Error("close", err, nil)
		}
	}
	s.owned = nil
}
