package compensation_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

const (
	groupChildSchemaEnv = "MILLRACE_COMPENSATION_GROUP_CHILD_SCHEMA"
	groupChildTopicEnv  = "MILLRACE_COMPENSATION_GROUP_CHILD_TOPIC"
	groupChildGroupEnv  = "MILLRACE_COMPENSATION_GROUP_CHILD_GROUP"
	groupChildNameEnv   = "MILLRACE_COMPENSATION_GROUP_CHILD_NAME"
)

// TestHelperGroupParticipant is not a test: TestParticipantsScaledWhileCommandsFlow
// runs the test binary again with this test selected, several times at
// once. It runs the participant of setup (reserve and release credit, an
// effect row each) with AddToRouter, reading the command topic with
// watermill-kafka's subscriber in the consumer group it is given, from the
// brokers in KAFKA_BROKERS. Every message it receives is recorded in the
// delivery table before the handler sees it. It announces itself ready
// once its router runs, and on SIGTERM closes the router (its handlers
// finish, the group is left) and exits.
func TestHelperGroupParticipant(t *testing.T) {
	schema := os.Getenv(groupChildSchemaEnv)
	if schema == "" {
		t.Skip("helper process for TestParticipantsScaledWhileCommandsFlow")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	name := os.Getenv(groupChildNameEnv)
	pool, err := pgtest.Connect(ctx, pgtest.URL(), 6)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p, err := compensation.NewParticipant(pool, compensation.Config{Schema: schema, Name: "payments", Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	effect, reservation, delivery := sqlident.Table(schema, "effect"), sqlident.Table(schema, "reservation"), sqlident.Table(schema, "delivery")
	err = compensation.Register(p, "reserve_credit",
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd reserveCredit) (reserved, error) {
			if _, err := tx.Exec(ctx, `INSERT INTO `+effect+` (saga_id, step, kind, amount) VALUES ($1, $2, 'reserve', $3)`, call.SagaID, call.Step, cmd.Amount); err != nil {
				return reserved{}, err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+reservation+` (saga_id, step, amount) VALUES ($1, $2, $3)`, call.SagaID, call.Step, cmd.Amount)
			return reserved{ReservationID: call.IdempotencyKey, Amount: cmd.Amount}, err
		},
		func(ctx context.Context, tx pgx.Tx, call compensation.Call, cmd reserveCredit) error {
			tag, err := tx.Exec(ctx, `DELETE FROM `+reservation+` WHERE saga_id = $1 AND step = $2`, call.SagaID, call.Step)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("release %s: no reservation", call.SagaID)
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+effect+` (saga_id, step, kind, amount) VALUES ($1, $2, 'release', $3)`, call.SagaID, call.Step, cmd.Amount)
			return err
		})
	if err != nil {
		t.Fatal(err)
	}
	brokers := devkafka.EnvBrokers()
	scfg := kafkatest.SaramaSubscriberConfig()
	// A killed member leaves the group when its session times out: the
	// shortest a Kafka broker allows by default.
	scfg.Consumer.Group.Session.Timeout = 6 * time.Second
	scfg.Consumer.Group.Heartbeat.Interval = time.Second
	scfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRoundRobin()}
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{Brokers: brokers, Unmarshaler: wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: scfg, ConsumerGroup: os.Getenv(groupChildGroupEnv)}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := message.MessageTransformSubscriberDecorator(func(m *message.Message) {
		if _, err := pool.Exec(context.Background(), `INSERT INTO `+delivery+` (msg_id, child) VALUES ($1, $2)`, m.UUID, name); err != nil {
			panic(err)
		}
	})(sub)
	if err != nil {
		t.Fatal(err)
	}
	poison, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.AddToRouter(router, compensation.RouterConfig{Topic: os.Getenv(groupChildTopicEnv), Subscriber: recorded, Poison: poison}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	<-router.Running()
	childtest.Announce()
	select {
	case <-ctx.Done():
	case err := <-done:
		t.Fatalf("router stopped by itself: %v", err)
	}
	if err := router.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := poison.Close(); err != nil {
		t.Fatal(err)
	}
	// Exit at once: the leak check of TestMain is for tests, and sarama's
	// goroutines wind down after Close.
	os.Exit(0)
}

// Participants scaled from one process to three and back to one while
// commands flow, through real consumer-group rebalances: three join (the
// group is seen with three members), one leaves gracefully (SIGTERM), one
// is SIGKILLed and dropped when its session expires, and the first one
// finishes alone. The commands (600 actions, and the compensations of 200
// of them, each after its action) are written through the outbox and
// relayed to a topic of six partitions, about 200 per phase, the last 100
// of a phase still in flight when the next change of members begins. At the end every command's
// effect is applied exactly once (the effect table, which has no unique
// key), every reply is written once and arrives on the reply topic (read
// by a separate consumer), whatever was delivered more than once.
func TestParticipantsScaledWhileCommandsFlow(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	ctx := context.Background()
	delivery := sqlident.Table(b.db.Schema, "delivery")
	if _, err := b.db.Pool.Exec(ctx, `CREATE TABLE `+delivery+` (msg_id text NOT NULL, child text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	brokers := kafkatest.Brokers(t)
	cmdTopic, replies, group := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Group()
	kafkatest.CreateTopic(t, brokers, cmdTopic, 6, nil)
	kafkatest.CreateTopic(t, brokers, replies, -1, nil)

	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := outbox.NewRelay(b.db.Pool, outbox.RelayConfig{Schema: b.db.Schema, Publisher: kafkaPublisher(t, brokers),
		PollInterval: 20 * time.Millisecond, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-relayDone; err != nil {
			t.Errorf("Relay.Run: %v", err)
		}
	})

	// The separate consumer of the replies.
	var mu sync.Mutex
	arrived := map[string]bool{} // saga id + operation
	sub := kafkatest.NewSubscriber(t, brokers)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	ch, err := sub.Subscribe(sctx, replies)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range ch {
			mu.Lock()
			arrived[m.Metadata.Get(core.MetadataSagaID)+"/"+m.Metadata.Get(core.MetadataSagaOperation)] = true
			mu.Unlock()
			m.Ack()
		}
	}()
	arrivedCount := func() int { mu.Lock(); defer mu.Unlock(); return len(arrived) }

	const sagas, compensateEvery, window = 600, 3, 100
	var cmds []*message.Message
	for i := range sagas {
		cmds = append(cmds, groupCommand(fmt.Sprintf("saga-%04d", i), core.OperationAction, replies))
		if j := i - 30; j >= 0 && j%compensateEvery == 0 {
			cmds = append(cmds, groupCommand(fmt.Sprintf("saga-%04d", j), core.OperationCompensation, replies))
		}
	}
	for j := sagas - 30; j < sagas; j++ {
		if j%compensateEvery == 0 {
			cmds = append(cmds, groupCommand(fmt.Sprintf("saga-%04d", j), core.OperationCompensation, replies))
		}
	}
	applied := func() int { return b.count(t, `SELECT count(*) FROM `+b.effect) }

	// The feeder writes the commands ten to a transaction, up to the
	// number each phase allows and at most window ahead of the effects
	// applied.
	var allowed atomic.Int64
	feederErr := make(chan error, 1)
	feedCtx, stopFeed := context.WithCancel(ctx)
	t.Cleanup(stopFeed)
	go func() {
		defer close(feederErr)
		for i := 0; i < len(cmds); i += 10 {
			for {
				var n int
				if err := b.db.Pool.QueryRow(feedCtx, `SELECT count(*) FROM `+b.effect).Scan(&n); err != nil {
					feederErr <- err
					return
				}
				if i+10 <= int(allowed.Load()) && i-n <= window {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			chunk := cmds[i:min(i+10, len(cmds))]
			if err := pgx.BeginFunc(feedCtx, b.db.Pool, func(tx pgx.Tx) error { return w.TxPublisher(tx).Publish(cmdTopic, chunk...) }); err != nil {
				feederErr <- err
				return
			}
		}
	}()

	env := func(name string) []string {
		return []string{groupChildSchemaEnv + "=" + b.db.Schema, groupChildTopicEnv + "=" + cmdTopic, groupChildGroupEnv + "=" + group,
			groupChildNameEnv + "=" + name, "KAFKA_BROKERS=" + strings.Join(brokers, ",")}
	}
	start := func(name string) *childtest.Child {
		return childtest.Start(t, "TestHelperGroupParticipant", env(name), time.Minute)
	}
	// phase waits for the group to be stable with members, lets the
	// feeder write up to upTo commands and waits until all but the last
	// window of them are applied: those are in flight when the next
	// phase's change of members begins.
	var phases []string
	phase := func(name string, members, upTo int) {
		t.Helper()
		from := applied()
		waitFor(t, 90*time.Second, fmt.Sprintf("%s: %d members in the group", name, members), func() bool { return groupMembers(t, brokers, group) == members })
		allowed.Store(int64(upTo))
		stable := applied()
		waitFor(t, 90*time.Second, name+": commands applied", func() bool { return applied() >= upTo-window })
		phases = append(phases, fmt.Sprintf("%s: applied %d while the group changed, %d with %d members", name, stable-from, applied()-stable, members))
	}

	began := time.Now()
	c1 := start("1")
	phase("one", 1, 200)
	c2, c3 := start("2"), start("3")
	phase("three", 3, 400)
	c3.Stop(t, time.Minute)
	phase("3 stopped", 2, 600)
	c2.Kill(t)
	phase("2 killed", 1, len(cmds))
	if err := <-feederErr; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "every command applied", func() bool { return applied() >= len(cmds) })
	waitFor(t, 90*time.Second, "every reply arrived", func() bool { return arrivedCount() >= len(cmds) })
	c1.Stop(t, time.Minute)
	took := time.Since(began)

	effects := applied()
	twice := b.count(t, `SELECT count(*) FROM (SELECT 1 FROM `+b.effect+` GROUP BY saga_id, step, kind HAVING count(*) > 1) x`)
	reserves := b.count(t, `SELECT count(DISTINCT saga_id) FROM `+b.effect+` WHERE kind = 'reserve'`)
	releases := b.count(t, `SELECT count(DISTINCT saga_id) FROM `+b.effect+` WHERE kind = 'release'`)
	replyRows := b.count(t, `SELECT count(*) FROM `+sqlident.Table(b.db.Schema, "outbox_event")+` WHERE topic = $1`, replies)
	deliveries := b.count(t, `SELECT count(*) FROM `+delivery)
	redelivered := b.count(t, `SELECT count(*) FROM (SELECT 1 FROM `+delivery+` GROUP BY msg_id HAVING count(*) > 1) x`)
	byChild := map[string]int{}
	rows, err := b.db.Pool.Query(ctx, `SELECT child, count(*) FROM `+delivery+` GROUP BY child`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		var n int
		if err := rows.Scan(&c, &n); err != nil {
			t.Fatal(err)
		}
		byChild[c] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("commands %d (%d sagas), effects %d, applied twice %d, replies written %d, arrived %d, deliveries %d (%d commands delivered more than once), per process %v, %s",
		len(cmds), sagas, effects, twice, replyRows, arrivedCount(), deliveries, redelivered, byChild, took.Round(time.Millisecond))
	t.Logf("phases: %s", strings.Join(phases, "; "))
	if effects != len(cmds) || twice != 0 || reserves != sagas || releases != len(cmds)-sagas {
		t.Fatalf("%d effects (%d applied twice, %d sagas reserved, %d released), want %d, none twice, %d and %d", effects, twice, reserves, releases, len(cmds), sagas, len(cmds)-sagas)
	}
	if replyRows != len(cmds) || arrivedCount() != len(cmds) {
		t.Fatalf("%d replies written, %d arrived; want %d each", replyRows, arrivedCount(), len(cmds))
	}
	for _, c := range []string{"1", "2", "3"} {
		if byChild[c] == 0 {
			t.Fatalf("process %s received no command: no rebalance gave it partitions", c)
		}
	}
}

// groupCommand is a command of the reserve_credit participant, with its
// saga id as partition key and its reply going to replies.
func groupCommand(saga, operation, replies string) *message.Message {
	m := command(saga, "credit", operation, 1, `{"account":"a-1","amount":40}`)
	m.Metadata.Set(core.MetadataSagaReplyTopic, replies)
	m.Metadata.Set(core.MetadataPartitionKey, saga)
	return m
}

// groupMembers returns the number of members of a stable consumer group,
// or -1 while it rebalances.
func groupMembers(t testing.TB, brokers []string, group string) int {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, c)
	if err != nil || len(resp.Groups) != 1 {
		return -1
	}
	if g := resp.Groups[0]; g.ErrorCode == 0 && g.State == "Stable" {
		return len(g.Members)
	}
	return -1
}
