package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
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
// its own schema, a relay that ships its outbox to Kafka, and a Watermill
// Router that consumes its topics.
type service struct {
	name    string
	schema  string // the service's own tables
	mschema string // millrace's tables
	pool    *pgxpool.Pool
	writer  *outbox.Writer // the service's one outbox Writer, shared by its components
	log     *logger

	brokers   []string
	group     string
	wlog      watermill.LoggerAdapter
	dup       *duplicating // the relay's publisher, duplicating some messages
	poison    *kafka.Publisher
	relayStop func()

	routers []*runningRouter

	deliveries atomic.Int64 // messages delivered to this service's handlers
}

// newService connects to the database, recreates the service's schemas
// with its own tables (ddl) and millrace's, and starts its relay.
func newService(ctx context.Context, cfg config, name, ddl string, lg *logger) (_ *service, err error) {
	n := names{cfg.Name}
	schema, mschema := n.schema(name), n.millrace(name)
	s := &service{name: name, schema: schema, mschema: mschema, log: lg, brokers: cfg.Brokers,
		group: n.group(name),
		wlog:  watermill.NewSlogLogger(slog.New(slog.NewTextHandler(lg.w, &slog.HandlerOptions{Level: slog.LevelError}))),
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

	// One Writer per service: its wake-up hints to the relay (a pg_notify,
	// which takes a database-wide lock at commit) are coalesced to one per
	// notifyInterval; the relay polls as a fallback.
	if s.writer, err = outbox.NewWriter(s.pool, outbox.WriterConfig{Schema: mschema, NotifyInterval: notifyInterval}); err != nil {
		return s, err
	}

	// The relay ships this service's outbox to Kafka. Its publisher sends
	// every dupEvery-th message twice, as a relay that crashed between the
	// broker's ack and marking the batch would: at-least-once, on purpose.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: cfg.Brokers}, s.wlog)
	if err != nil {
		return s, fmt.Errorf("%s: Kafka publisher: %w", name, err)
	}
	s.dup = &duplicating{Publisher: pub}
	if cfg.Faults {
		s.dup.every = dupEvery
	}
	relay, err := outbox.NewRelay(s.pool, outbox.RelayConfig{Schema: mschema, Publisher: s.dup, Logger: s.wlog,
		PollInterval: 100 * time.Millisecond})
	if err != nil {
		_ = pub.Close()
		return s, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = relay.Run(rctx) }()
	s.relayStop = func() { cancel(); <-done; s.dup.held.Wait(); _ = pub.Close() }

	// Poison messages (ones that can never be handled) go straight to the
	// broker, to <topic>.poison, with the reason.
	if s.poison, err = kafka.NewPublisher(kafka.PublisherConfig{Brokers: cfg.Brokers}, s.wlog); err != nil {
		return s, err
	}
	return s, nil
}

// notifyInterval is the least time between two relay wake-ups a service's
// Writer sends.
const notifyInterval = 20 * time.Millisecond

// dupEvery: with faults on, every dupEvery-th message a relay publishes is
// published twice.
const dupEvery = 7

// subscriber returns a Kafka subscriber in the service's consumer group.
func (s *service) subscriber() (message.Subscriber, error) {
	// sarama's consumer groups need a protocol version the brokers speak;
	// a new group starts at the oldest record.
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0
	sc.Net.DialTimeout = 10 * time.Second
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	// A fetch returns as soon as a record is there, or after MaxWaitTime
	// (sarama's default, 500ms, is a long wait per hop for a saga whose
	// every step is a command and a reply).
	sc.Consumer.MaxWaitTime = 20 * time.Millisecond
	return wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               s.brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         s.group,
	}, s.wlog)
}

// newRouter returns a Router whose outermost middleware counts deliveries.
func (s *service) newRouter() (*message.Router, error) {
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, s.wlog)
	if err != nil {
		return nil, err
	}
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			s.deliveries.Add(1)
			return h(msg)
		}
	})
	return r, nil
}

// retry is the in-process retry of every handler: a failed try rolls its
// transaction back and runs again in a fresh one; permanent errors are
// not retried (they go to the poison topic).
func (s *service) retry() *middleware.Retry {
	return &middleware.Retry{MaxRetries: 8, InitialInterval: 50 * time.Millisecond, MaxInterval: time.Second,
		Multiplier: 2, ShouldRetry: inbox.ShouldRetry}
}

// runningRouter is a Router running in the background.
type runningRouter struct {
	r    *message.Router
	done chan error
	once sync.Once
}

// start runs r until stop.
func start(ctx context.Context, r *message.Router) (*runningRouter, error) {
	rr := &runningRouter{r: r, done: make(chan error, 1)}
	go func() { rr.done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
		return rr, nil
	case err := <-rr.done:
		return nil, fmt.Errorf("router: %w", err)
	case <-ctx.Done():
		rr.stop()
		return nil, ctx.Err()
	}
}

// stop closes the router: it waits for the handlers in progress and closes
// the subscribers. Stopping twice is a no-op.
func (rr *runningRouter) stop() {
	rr.once.Do(func() {
		_ = rr.r.Close()
		<-rr.done
	})
}

// run starts r and keeps it for close.
func (s *service) run(ctx context.Context, r *message.Router) error {
	rr, err := start(ctx, r)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	s.routers = append(s.routers, rr)
	return nil
}

// stopConsuming stops the service's routers.
func (s *service) stopConsuming() {
	for _, r := range s.routers {
		r.stop()
	}
}

// close stops everything the service runs and closes its pool. The schema
// stays (tearDown drops it).
func (s *service) close() {
	s.stopConsuming()
	if s.relayStop != nil {
		s.relayStop()
		s.relayStop = nil
	}
	if s.poison != nil {
		_ = s.poison.Close()
		s.poison = nil
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
