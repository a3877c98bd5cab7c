package millrace_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/internal/childtest"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/saga"
)

// The scale-out test's environment for its instances (child processes).
const (
	scaleSchemaEnv   = "MILLRACE_SCALE_SCHEMA"
	scaleNameEnv     = "MILLRACE_SCALE_NAME"
	scaleTopicsEnv   = "MILLRACE_SCALE_TOPICS" // the reply topic, then the three command topics, comma-separated
	scaleInstanceEnv = "MILLRACE_SCALE_INSTANCE"
	scaleBrokersEnv  = "MILLRACE_SCALE_BROKERS"
)

var scaleSteps = []string{"credit", "stock", "ship"}

// scaleDefinition is the scale-out saga: three remote steps, each to a
// participant of the same service.
func scaleDefinition(topics []string) (*saga.Definition[order], error) {
	steps := make([]saga.Step[order], len(scaleSteps))
	for i, s := range scaleSteps {
		steps[i] = saga.Step[order]{Name: s, Kind: saga.Compensatable,
			Action: &saga.Command[order]{Topic: topics[1+i]}, Compensation: &saga.Command[order]{}}
	}
	return saga.Define(saga.Spec[order]{Type: "scaled", Version: 1, ReplyTopic: topics[0], Steps: steps})
}

// TestHelperScaleOutInstance is not a test: TestScaleOutInstancesSplitTheWork
// runs the test binary again with it selected, once per instance of the
// service. It runs the service (millrace.New with its defaults) with the
// saga registered and a participant per step, whose action records which
// instance ran it; it announces itself ready once Run has started, and
// stops on SIGTERM.
func TestHelperScaleOutInstance(t *testing.T) {
	schema := os.Getenv(scaleSchemaEnv)
	if schema == "" {
		t.Skip("an instance of TestScaleOutInstancesSplitTheWork, run by it")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgtest.Connect(ctx, pgtest.URL(), 12)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	topics := strings.Split(os.Getenv(scaleTopicsEnv), ",")
	instance := os.Getenv(scaleInstanceEnv)
	svc, err := millrace.New(pool, millrace.Config{Name: os.Getenv(scaleNameEnv), Schema: schema,
		Brokers: strings.Split(os.Getenv(scaleBrokersEnv), ","), Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	def, err := scaleDefinition(topics)
	if err == nil {
		err = svc.Orchestrator().Register(def)
	}
	if err != nil {
		t.Fatal(err)
	}
	ran := sqlident.Table(schema, "ran")
	for i, step := range scaleSteps {
		p, err := svc.AddParticipant(step, topics[1+i])
		if err != nil {
			t.Fatal(err)
		}
		err = compensation.Register(p, step,
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, o order) (struct{}, error) {
				_, err := tx.Exec(ctx, `INSERT INTO `+ran+` (saga_id, step, instance) VALUES ($1, $2, $3)`, call.SagaID, step, instance)
				return struct{}{}, err
			}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	childtest.Announce()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// Three instances of one service (three processes, one schema, one
// consumer group) split the sagas' replies and commands; one is SIGKILLed
// while sagas flow, and the other two take over its partitions and its
// sagas: every saga completes, each step's action ran exactly once (the
// barrier and the inbox marks hold across instances), and none is stuck.
func TestScaleOutInstancesSplitTheWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	brokers := kafkatest.Brokers(t)
	ctx := context.Background()
	topics := []string{kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()}
	for _, topic := range topics {
		kafkatest.CreateTopic(t, brokers, topic, 6, nil)
	}
	ran := sqlident.Table(db.Schema, "ran")
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+ran+` (saga_id text NOT NULL, step text NOT NULL, instance text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	def, err := scaleDefinition(topics)
	if err != nil {
		t.Fatal(err)
	}
	starter, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err == nil {
		err = starter.Register(def)
	}
	if err != nil {
		t.Fatal(err)
	}
	name := kafkatest.Group()
	env := func(instance string) []string {
		return []string{scaleSchemaEnv + "=" + db.Schema, scaleNameEnv + "=" + name, scaleTopicsEnv + "=" + strings.Join(topics, ","),
			scaleInstanceEnv + "=" + instance, scaleBrokersEnv + "=" + strings.Join(brokers, ",")}
	}
	instances := map[string]*childtest.Child{}
	for _, i := range []string{"a", "b", "c"} {
		instances[i] = childtest.Start(t, "TestHelperScaleOutInstance", env(i), time.Minute)
	}

	const sagas = 300
	start := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("scaled-%03d", i)
			if _, err := saga.Start(ctx, starter, def, id, order{ID: id, Amount: i}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	instancesRan := func() int { return count(`SELECT count(DISTINCT instance) FROM ` + ran) }
	start(0, sagas/2)
	// All three take part before one dies.
	waitFor(t, "the three instances running actions", func() bool { return instancesRan() == 3 })
	instances["b"].Kill(t)
	start(sagas/2, sagas)

	inst := sqlident.Table(db.Schema, "saga_instance")
	deadline := time.Now().Add(3 * time.Minute)
	for count(`SELECT count(*) FROM `+inst+` WHERE status = 'completed'`) < sagas {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sagas completed in 3 minutes after instance b was killed; by status: %v", count(`SELECT count(*) FROM `+inst+` WHERE status = 'completed'`), sagas,
				statuses(t, db, inst))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := count(`SELECT count(*) FROM ` + inst + ` WHERE status <> 'completed'`); n != 0 {
		t.Fatalf("%d sagas did not complete: %v", n, statuses(t, db, inst))
	}
	// Each step's action ran once: no command applied twice across the
	// instances, the killed one's included.
	if n := count(`SELECT count(*) FROM (SELECT saga_id, step FROM ` + ran + ` GROUP BY 1, 2 HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d actions ran more than once", n)
	}
	if n := count(`SELECT count(*) FROM ` + ran); n != sagas*len(scaleSteps) {
		t.Fatalf("%d actions ran, want %d", n, sagas*len(scaleSteps))
	}
	// The two survivors took over: the sagas started after the kill ran on
	// them alone, on both.
	after := fmt.Sprintf("scaled-%03d", sagas/2)
	if n := count(`SELECT count(*) FROM `+ran+` WHERE instance = 'b' AND saga_id >= $1`, after); n != 0 {
		t.Fatalf("instance b ran %d actions of sagas started after it was killed", n)
	}
	for _, i := range []string{"a", "c"} {
		if n := count(`SELECT count(*) FROM `+ran+` WHERE instance = $1 AND saga_id >= $2`, i, after); n == 0 {
			t.Errorf("instance %s ran none of the sagas started after the kill", i)
		}
	}
	for _, i := range []string{"a", "c"} {
		instances[i].Stop(t, time.Minute)
	}
}

// statuses counts the sagas of table inst by status and step.
func statuses(t *testing.T, db *pgtest.DB, inst string) map[string]int {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `SELECT status || ' at ' || step, count(*) FROM `+inst+` GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	return out
}
