package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// names are the schemas, topics and consumer groups of one run, derived
// from its name so that services in separate processes agree on them.
type names struct {
	run string
}

// schema is a service's schema for its own tables, and millrace its schema
// for millrace's tables (outbox, inbox marks, barrier or saga state): the
// two schemas a service would have in a database of its own.
func (n names) schema(service string) string { return n.run + "_" + service }

func (n names) millrace(service string) string { return n.run + "_" + service + "_millrace" }

// schemas are every schema of a run.
func (n names) schemas() []string {
	var out []string
	for _, s := range services {
		out = append(out, n.schema(s), n.millrace(s))
	}
	return out
}

// commands is a participant's command topic.
func (n names) commands(service string) string { return n.run + "." + service + ".commands" }

// replies is where participants reply to the order saga's commands.
func (n names) replies() string { return n.run + ".orders.saga-replies" }

// group is a service's Kafka consumer group.
func (n names) group(service string) string { return n.run + "." + service }

// service is what every service of the demo runs on: a connection pool to
// its own schema, and a millrace.Service on millrace's schema that runs its
// relay (publishing through a publisher that injects faults), its
// participant or its sagas, and retention.
type service struct {
	name    string
	schema  string // the service's own tables
	mschema string // millrace's tables
	pool    *pgxpool.Pool
	log     *logger

	cfg  millrace.Config
	wlog watermill.LoggerAdapter
	dup  *duplicating // the relay's publisher, duplicating some messages
	// metrics are the registries of the millrace.Services run so far, one
	// each (a restarted service is a new process, with registries of its
	// own).
	metrics []*prometheus.Registry

	mu      sync.Mutex
	svc     *millrace.Service // the running one
	stopRun func() error      // stops it: nil when none runs
	// consumer, if set, is what consumes the service's commands instead of
	// svc (the Python payment service, python.go): stop stops it first, and
	// it counts its deliveries.
	consumer   func()
	deliveredP atomic.Int64
}

// newService connects to the database, recreates the service's schemas
// with its own tables (ddl) and millrace's, and builds its millrace.Service:
// add its participant or register its sagas, then start it.
func newService(ctx context.Context, cfg config, name, ddl string, lg *logger) (_ *service, err error) {
	n := names{cfg.Name}
	schema, mschema := n.schema(name), n.millrace(name)
	s := &service{name: name, schema: schema, mschema: mschema, log: lg,
		wlog: watermill.NewSlogLogger(slog.New(slog.NewTextHandler(lg.w, &slog.HandlerOptions{Level: slog.LevelError}))),
	}
	if lg.w == io.Discard {
		s.wlog = watermill.NopLogger{}
	}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.pool, err = connect(ctx, cfg.DatabaseURL, schema, poolSize(cfg, name)); err != nil {
		return s, err
	}
	for _, sc := range []string{schema, mschema} {
		if _, err := s.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{sc}.Sanitize()+` CASCADE`); err != nil {
			return s, fmt.Errorf("%s: drop schema %s: %w", name, sc, err)
		}
	}
	m, err := migrations.New(s.pool, migrations.Config{Schema: mschema})
	if err != nil {
		return s, err
	}
	if _, err := m.Up(ctx); err != nil {
		return s, fmt.Errorf("%s: migrate schema %s: %w", name, mschema, err)
	}
	if _, err := s.pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize()+`; `+ddl); err != nil {
		return s, fmt.Errorf("%s: create tables: %w", name, err)
	}

	// The relay's publisher sends every dupEvery-th message twice, as a
	// relay that crashed between the broker's ack and marking the batch
	// would: at-least-once, on purpose.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cfg.Brokers}, s.wlog)
	if err != nil {
		return s, fmt.Errorf("%s: Kafka publisher: %w", name, err)
	}
	s.dup = &duplicating{Publisher: pub}
	if cfg.Faults {
		s.dup.every = dupEvery
	}
	// One service, one Config: the schema, the brokers (its consumer
	// group is its name), the publisher and the logger are said here.
	s.cfg = millrace.Config{
		Name: n.group(name), Schema: mschema, Brokers: cfg.Brokers, Publisher: s.dup, Logger: s.wlog,
		Saga:  saga.Config{Consumer: sagaConsumer, PollInterval: 100 * time.Millisecond},
		Relay: outbox.RelayConfig{PollInterval: 100 * time.Millisecond},
	}
	if s.svc, err = s.newMillrace(); err != nil {
		return s, fmt.Errorf("%s: %w", name, err)
	}
	return s, nil
}

// newMillrace builds a millrace.Service from s.cfg, with a metrics
// registry of its own.
func (s *service) newMillrace() (*millrace.Service, error) {
	reg := prometheus.NewRegistry()
	cfg := s.cfg
	cfg.Metrics = reg
	svc, err := millrace.New(s.pool, cfg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.metrics = append(s.metrics, reg)
	s.mu.Unlock()
	return svc, nil
}

// dupEvery: with faults on, every dupEvery-th message a relay publishes is
// published twice.
const dupEvery = 7

// start runs the service's millrace.Service until stop; a Run that fails
// on its own is logged.
func (s *service) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	svc := s.svc
	go func() {
		err := svc.Run(ctx)
		if err != nil {
			s.log.say("%s: %v", s.name, err)
		}
		done <- err
	}()
	var once sync.Once
	var err error
	s.stopRun = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
}

// stop stops the running service: it finishes the batches in hand, then
// its relay ships what was written meanwhile. Stopping twice is a no-op.
func (s *service) stop() {
	s.mu.Lock()
	stop, consumer := s.stopRun, s.consumer
	s.stopRun, s.consumer = nil, nil
	s.mu.Unlock()
	if consumer != nil {
		consumer()
	}
	if stop != nil {
		_ = stop()
	}
}

// deliveries is the number of messages this service's consumers took into
// their transactions (duplicates among them), from its metrics.
func (s *service) deliveries() int64 {
	s.mu.Lock()
	regs := s.metrics
	s.mu.Unlock()
	n := float64(s.deliveredP.Load())
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			continue
		}
		for _, mf := range mfs {
			if mf.GetName() == "millrace_saga_reply_batch_size" || mf.GetName() == "millrace_compensation_batch_size" {
				for _, m := range mf.GetMetric() {
					n += m.GetHistogram().GetSampleSum()
				}
			}
		}
	}
	return int64(n)
}

// close stops everything the service runs and closes its pool. The schema
// stays (tearDown drops it).
func (s *service) close() {
	s.stop()
	if s.svc != nil {
		_ = s.svc.Close()
	}
	if s.dup != nil {
		s.dup.held.Wait()
		_ = s.dup.Close()
		s.dup = nil
	}
	if s.pool != nil {
		s.pool.Close()
		s.pool = nil
	}
}

// connect opens a pool whose connections find unqualified table names in
// schema, so the services' SQL reads plainly. millrace's components are
// given the schema in their Config.
func connect(ctx context.Context, url, schema string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	if schema != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = schema
	}
	pc.MaxConns = maxConns
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s:%d (database %q) does not answer: %w; run scripts/pg-up.sh or set DATABASE_URL",
			pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Database, err)
	}
	return pool, nil
}

// duplicating is the relays' publisher: after a batch is acknowledged, it
// publishes every every-th message of it again (same event id), so the
// consumers see duplicate deliveries, as after a relay crash between
// the broker's ack and marking the batch published. It also holds back the
// messages late selects for stockLate, as a slow network would.
type duplicating struct {
	*kafka.Publisher
	every int64
	n     atomic.Int64
	dups  atomic.Int64

	late   func(*message.Message) bool
	onLate func(*message.Message)
	held   sync.WaitGroup
}

// The relays send a batch of several topics through PublishTopics.
var _ outbox.TopicsPublisher = (*duplicating)(nil)

func (p *duplicating) Publish(topic string, msgs ...*message.Message) error {
	if msgs = p.holdLate(topic, msgs); len(msgs) == 0 {
		return nil
	}
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err // a *core.BatchError passes through unchanged
	}
	if again := p.copies(msgs); len(again) > 0 && p.Publisher.Publish(topic, again...) == nil {
		p.dups.Add(int64(len(again)))
	}
	return nil
}

// PublishTopics is Publish for a relay's batch of several topics, with
// the same faults: the messages kept go to the Kafka publisher in one call,
// and so do the copies. (It must be defined here: the Kafka publisher's
// own, promoted, would skip the faults.)
func (p *duplicating) PublishTopics(byTopic map[string][]*message.Message) error {
	kept := map[string][]*message.Message{}
	for topic, msgs := range byTopic {
		if msgs = p.holdLate(topic, msgs); len(msgs) > 0 {
			kept[topic] = msgs
		}
	}
	if len(kept) == 0 {
		return nil
	}
	if err := p.Publisher.PublishTopics(kept); err != nil {
		return err // a *core.BatchError passes through unchanged
	}
	again, n := map[string][]*message.Message{}, 0
	for topic, msgs := range kept {
		if c := p.copies(msgs); len(c) > 0 {
			again[topic], n = c, n+len(c)
		}
	}
	if n > 0 && p.Publisher.PublishTopics(again) == nil {
		p.dups.Add(int64(n))
	}
	return nil
}

// holdLate returns msgs without those late selects, each of which it
// publishes to topic on its own, stockLate later.
func (p *duplicating) holdLate(topic string, msgs []*message.Message) []*message.Message {
	if p.late == nil {
		return msgs
	}
	keep := msgs[:0:0]
	for _, m := range msgs {
		if !p.late(m) {
			keep = append(keep, m)
			continue
		}
		p.onLate(m)
		p.held.Add(1)
		go func() {
			defer p.held.Done()
			time.Sleep(stockLate) // the fault: a message that takes its time
			for p.Publisher.Publish(topic, m) != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	return keep
}

// copies returns a copy of every every-th message of msgs, counted across
// calls.
func (p *duplicating) copies(msgs []*message.Message) []*message.Message {
	if p.every <= 0 {
		return nil
	}
	var again []*message.Message
	for _, m := range msgs {
		if p.n.Add(1)%p.every == 0 {
			again = append(again, m.Copy())
		}
	}
	return again
}

// logger writes the demo's progress and fault lines, stamped with the time
// since the start.
type logger struct {
	w     io.Writer
	start time.Time
	mu    sync.Mutex
}

func (l *logger) say(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.w, "%6.1fs  "+format+"\n", append([]any{time.Since(l.start).Seconds()}, args...)...)
}

// fault logs an injected fault or what the framework did about it.
func (l *logger) fault(format string, args ...any) { l.say("fault: "+format, args...) }

// poolSize is a service's connection pool size: cfg.Conns, and for orders
// four more (its writers, timers and operator besides the reply handlers).
// Handlers beyond it wait for a connection.
func poolSize(cfg config, service string) int32 {
	if service == "orders" {
		return int32(cfg.Conns + 4)
	}
	return int32(cfg.Conns)
}

// partitions is the partition count of the embedded broker's topics: the
// most messages of one topic a consumer group handles at once.
const partitions = 16
