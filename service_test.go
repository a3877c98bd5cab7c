package millrace_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// testBundle is a service with one saga ("order": reserve credit at the
// participant "payments") on an isolated schema and an embedded broker.
type testBundle struct {
	db          *pgtest.DB
	brokers     []string
	def         *saga.Definition[order]
	creditTopic string
	cfg         millrace.Config
}

// relayFast polls often, for tests that wait on the relay.
var relayFast = outbox.RelayConfig{PollInterval: 50 * time.Millisecond}

func setup(t *testing.T, migrate bool) *testBundle {
	t.Helper()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: !migrate})
	b := &testBundle{db: db, brokers: kafkatest.Brokers(t), creditTopic: kafkatest.Topic()}
	var err error
	b.def, err = saga.Define(saga.Spec[order]{
		Type: "order", Version: 1, ReplyTopic: kafkatest.Topic(),
		Steps: []saga.Step[order]{{
			Name: "credit", Kind: saga.Compensatable,
			Action:       &saga.Command[order]{Topic: b.creditTopic},
			Compensation: &saga.Command[order]{},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = millrace.Config{
		Name: kafkatest.Group(), Schema: db.Schema, Brokers: b.brokers,
		Saga:   saga.Config{PollInterval: 50 * time.Millisecond},
		Relay:  relayFast,
		Logger: watermill.NopLogger{},
	}
	return b
}

// service builds a Service from b.cfg with the order saga registered and
// the participant "payments" added.
func (b *testBundle) service(t *testing.T) *millrace.Service {
	t.Helper()
	svc, err := millrace.New(b.db.Pool, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Orchestrator().Register(b.def); err != nil {
		t.Fatal(err)
	}
	payments, err := svc.AddParticipant("payments", b.creditTopic)
	if err != nil {
		t.Fatal(err)
	}
	err = compensation.Register(payments, "credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) (struct{}, error) {
			return struct{}{}, nil
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// run runs svc in the background; stop cancels it and returns Run's error.
func run(t *testing.T, svc *millrace.Service) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("Run did not return within a minute of its context ending")
			}
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunCompletesASagaAndStopsOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.cfg.Metrics = prometheus.NewRegistry()
	svc := b.service(t)
	stop := run(t, svc)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := saga.Start(ctx, svc.Orchestrator(), b.def, id, order{ID: id, Amount: 5}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "completed saga", func() bool {
		in, err := svc.Orchestrator().Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return in.Status == saga.StatusCompleted
	})
	// The service's metrics: its parts' counters, its outbox's backlog and
	// its consumer group's lag, labelled with its name.
	mfs, err := b.cfg.Metrics.(*prometheus.Registry).Gather()
	if err != nil {
		t.Fatal(err)
	}
	families := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == b.cfg.Name || l.GetName() == "group" && l.GetValue() == b.cfg.Name {
					families[mf.GetName()] = true
				}
			}
		}
	}
	for _, name := range []string{"millrace_saga_started_total", "millrace_compensation_actions_total", "millrace_outbox_published_total", "millrace_outbox_pending", "millrace_outbox_oldest_pending_age_seconds", "millrace_kafka_consumer_lag"} {
		if !families[name] {
			t.Errorf("no %s of the service among %v", name, families)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after cancel: %v, want nil", err)
	}
	if err := svc.Run(ctx); !errors.Is(err, millrace.ErrRunTwice) {
		t.Fatalf("second Run: %v, want ErrRunTwice", err)
	}
	// TestMain's leak check fails the package if a part outlived Run.
}

func TestRunReturnsTheFailingPart(t *testing.T) {
	t.Parallel()
	b := setup(t, false) // no tables: the relay and the saga timers refuse to start
	svc := b.service(t)
	var err error
	done := make(chan error, 1)
	go func() { done <- svc.Run(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not fail within a minute on a schema without tables")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" && pgErr.Code != "3F000" {
		t.Fatalf("Run: %v, want the undefined-table or undefined-schema error", err)
	}
	// The relay, the saga timers and retention all refuse a schema
	// without their tables at start; whichever fails first is named.
	prefix := "service " + b.cfg.Name + ": "
	if msg := err.Error(); !strings.HasPrefix(msg, prefix+"relay: ") && !strings.HasPrefix(msg, prefix+"saga timers: ") &&
		!strings.HasPrefix(msg, prefix+"retention: ") ||
		!strings.Contains(msg, "migrations applied?") {
		t.Fatalf("Run: %q, want it to start with %q and a part (relay or saga timers), and ask whether migrations were applied", err, prefix)
	}
}

func TestPoisonGoesThroughTheOutboxByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	run(t, b.service(t))
	// A command no participant can take, with text PostgreSQL cannot store
	// in its metadata and a payload that is not JSON, straight to the
	// broker.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.brokers}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	bad := message.NewMessage(uuid.NewString(), []byte("\xff not json"))
	bad.Metadata.Set("test_case", "a\x00b\xfe")
	bad.Metadata.Set(core.MetadataContentType, core.ContentTypeJSON)
	if err := pub.Publish(b.creditTopic, bad); err != nil {
		t.Fatal(err)
	}
	got := kafkatest.Read(t, b.brokers, b.creditTopic+".poison", 1)[0]
	if got.Metadata.Get(core.MetadataPoisonedID) != bad.UUID {
		t.Fatalf("poisoned message id %q, want %q", got.Metadata.Get(core.MetadataPoisonedID), bad.UUID)
	}
	if got.Metadata.Get(middleware.ReasonForPoisonedKey) == "" {
		t.Fatal("no reason_poisoned on the poisoned message")
	}
	if string(got.Payload) != string(bad.Payload) || got.Metadata.Get("test_case") != "a\uFFFDb\uFFFD" {
		t.Fatalf("poisoned message: payload %q, test_case %q", got.Payload, got.Metadata.Get("test_case"))
	}
	// It went through the service's outbox, not around it.
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{b.db.Schema, "outbox_event"}.Sanitize()+
		` WHERE topic = $1`, b.creditTopic+".poison").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d poison events in the outbox, want 1", n)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for name, edit := range map[string]func(c *millrace.Config){
		"no name":              func(c *millrace.Config) { c.Name = "" },
		"no brokers":           func(c *millrace.Config) { c.Brokers = nil },
		"bad schema":           func(c *millrace.Config) { c.Schema = "no;" },
		"relay schema":         func(c *millrace.Config) { c.Relay.Schema = "other" },
		"saga schema":          func(c *millrace.Config) { c.Saga.Schema = "other" },
		"negative retention":   func(c *millrace.Config) { c.Retention.Events = -time.Hour },
		"negative saga config": func(c *millrace.Config) { c.Saga.PollInterval = -1 },
	} {
		if svc, err := millrace.New(b.db.Pool, b.cfg); err != nil {
			t.Fatal(err)
		} else {
			_ = svc.Close()
		}
		cfg := b.cfg
		edit(&cfg)
		if svc, err := millrace.New(b.db.Pool, cfg); !errors.Is(err, core.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
			if err == nil {
				_ = svc.Close()
			}
		}
	}
}

// AddParticipant refuses what cannot run: no topic, a name given twice, a
// participant added after Run; Run refuses a participant without commands.
// A Service closed without Run leaves nothing running (TestMain's leak
// check) and does not run.
func TestAddParticipantRefusesWhatCannotRun(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	svc, err := millrace.New(b.db.Pool, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.AddParticipant("p"); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("no topic: %v, want ErrConfig", err)
	}
	if _, err := svc.AddParticipant("p", b.creditTopic); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.AddParticipant("p", kafkatest.Topic()); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("twice: %v, want ErrConfig", err)
	}
	if err := svc.Run(context.Background()); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "no command") {
		t.Fatalf("Run with a participant without commands: %v, want ErrConfig saying so", err)
	}
	if _, err := svc.AddParticipant("q", kafkatest.Topic()); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("after Run: %v, want ErrConfig", err)
	}

	idle, err := millrace.New(b.db.Pool, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := idle.Close(); err != nil {
		t.Fatal(err)
	}
	if err := idle.Run(context.Background()); !errors.Is(err, millrace.ErrRunTwice) {
		t.Fatalf("Run after Close: %v, want ErrRunTwice", err)
	}
}

// endedSubscriber is a Subscriber whose subscriptions end at once.
type endedSubscriber struct{}

func (endedSubscriber) Subscribe(context.Context, string) (<-chan *message.Message, error) {
	ch := make(chan *message.Message)
	close(ch)
	return ch, nil
}
func (endedSubscriber) Close() error { return nil }

// A consumer whose subscription ends while the service runs stops the
// service with an error that says so: nothing stops consuming silently.
func TestRunFailsWhenASubscriptionEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.cfg.Subscriber = endedSubscriber{}
	svc := b.service(t)
	done := make(chan error, 1)
	go func() { done <- svc.Run(context.Background()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run went on for a minute with its subscriptions ended")
	}
	if err == nil || !strings.Contains(err.Error(), "subscription to") || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("Run: %v, want the ended subscription named", err)
	}
}

// A Service with NoRelay and nothing to consume, and no broker, runs only
// retention: a process of its own for it.
func TestRetentionOnlyService(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	ctx := context.Background()
	// An event published two hours ago, as the relay marks one.
	events, pending := pgx.Identifier{b.db.Schema, "outbox_event"}.Sanitize(), pgx.Identifier{b.db.Schema, "outbox_pending"}.Sanitize()
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Pool.Exec(ctx, `WITH e AS (UPDATE `+events+` SET created_at = now() - interval '3 hours', published_at = now() - interval '2 hours' RETURNING id)
DELETE FROM `+pending+` p USING e WHERE p.id = e.id`); err != nil {
		t.Fatal(err)
	}
	svc, err := millrace.New(b.db.Pool, millrace.Config{Name: "retention", Schema: b.db.Schema, NoRelay: true, Logger: watermill.NopLogger{},
		Retention: millrace.Retention{Events: time.Hour, Interval: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	run(t, svc)
	waitFor(t, "the old event removed", func() bool {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+events).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	if _, err := svc.AddParticipant("p", b.creditTopic); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("AddParticipant after Run: %v", err)
	}
	bare, err := millrace.New(b.db.Pool, millrace.Config{Name: "no-broker", Schema: b.db.Schema, NoRelay: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.AddParticipant("p", b.creditTopic); err != nil {
		t.Fatal(err)
	}
	if err := bare.Run(ctx); !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), "to consume") {
		t.Fatalf("a participant without a broker: %v, want ErrConfig", err)
	}
}

// A Service runs retention: a completed saga whose window has passed is
// removed with its history; one that ended recently stays.
func TestRunCleansEndedSagas(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.cfg.Retention = millrace.Retention{Completed: time.Hour, Interval: 50 * time.Millisecond}
	svc := b.service(t)
	run(t, svc)
	ctx := context.Background()
	old, recent := uuid.NewString(), uuid.NewString()
	for _, id := range []string{old, recent} {
		if _, err := saga.Start(ctx, svc.Orchestrator(), b.def, id, order{ID: id, Amount: 5}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{old, recent} {
		waitFor(t, "completed saga", func() bool {
			in, err := svc.Orchestrator().Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return in.Status == saga.StatusCompleted
		})
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE "`+b.db.Schema+`".saga_instance SET ended_at = now() - interval '2 hours' WHERE id = $1`, old); err != nil {
		t.Fatal(err)
	}
	count := func(table, id string) int {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+b.db.Schema+`".`+table+` WHERE `+map[string]string{"saga_instance": "id", "saga_history": "saga_id"}[table]+` = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "old saga removed", func() bool { return count("saga_instance", old) == 0 })
	if n := count("saga_history", old); n != 0 {
		t.Fatalf("%d history rows of the removed saga left", n)
	}
	if count("saga_instance", recent) != 1 || count("saga_history", recent) == 0 {
		t.Fatal("the recently completed saga was removed")
	}
}

// A Service keeps the audit trail for Retention.Audit: an operator
// action recorded longer ago is removed, a recent one stays.
func TestRunCleansTheAuditTrail(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.cfg.Retention = millrace.Retention{Audit: time.Hour, Interval: 50 * time.Millisecond}
	svc := b.service(t)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := saga.Start(ctx, svc.Orchestrator(), b.def, id, order{ID: id, Amount: 5}); err != nil {
		t.Fatal(err)
	}
	by := saga.Actor{Operator: "ada", Reason: "hold it"}
	if _, err := svc.Orchestrator().Pause(ctx, id, by); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Orchestrator().Resume(ctx, id, by); err != nil {
		t.Fatal(err)
	}
	audited := func() int {
		var n int
		if err := b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM "`+b.db.Schema+`".audit_log WHERE target = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := audited(); n != 2 {
		t.Fatalf("%d audit entries for the pause and the resume, want 2", n)
	}
	if _, err := b.db.Pool.Exec(ctx, `UPDATE "`+b.db.Schema+`".audit_log SET at = now() - interval '2 hours'
 WHERE id = (SELECT min(id) FROM "`+b.db.Schema+`".audit_log WHERE target = $1)`, id); err != nil {
		t.Fatal(err)
	}
	run(t, svc)
	waitFor(t, "the old entry removed", func() bool { return audited() == 1 })
}

// A saga whose command name is misspelt: the participant poisons the
// command and also answers it, with a failure whose reason says it was
// poisoned and why, so the saga fails its step at once with that reason
// (compensated here, before any pivot) instead of timing out with
// "N attempts timed out".
func TestPoisonedCommandFailsItsStepWithTheReason(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	var err error
	b.def, err = saga.Define(saga.Spec[order]{
		Type: "order", Version: 1, ReplyTopic: kafkatest.Topic(),
		Steps: []saga.Step[order]{{
			Name: "credit", Kind: saga.Compensatable, Timeout: time.Hour,
			Action:       &saga.Command[order]{Topic: b.creditTopic, Name: "crdit"},
			Compensation: &saga.Command[order]{},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	svc := b.service(t)
	run(t, svc)
	ctx := context.Background()
	id := uuid.NewString()
	if _, err := saga.Start(ctx, svc.Orchestrator(), b.def, id, order{ID: id, Amount: 5}); err != nil {
		t.Fatal(err)
	}
	var in *saga.Instance
	waitFor(t, "compensated saga", func() bool {
		if in, err = svc.Orchestrator().Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		return in.Status == saga.StatusCompensated
	})
	if !strings.Contains(in.LastError, "poisoned: ") || !strings.Contains(in.LastError, `unknown command: "crdit"`) {
		t.Fatalf("last error %q, want the poison reason", in.LastError)
	}
	if got := kafkatest.Read(t, b.brokers, b.creditTopic+".poison", 1)[0]; got.Metadata.Get(core.MetadataSagaID) != id {
		t.Fatalf("poisoned %v", got.Metadata)
	}
}
