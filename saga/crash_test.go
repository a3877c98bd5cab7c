package saga_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sagahook"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/saga"
)

const childEnv = "MILLRACE_SAGA_CHILD" // schema;brokers;credit;stock;reply;seed

// TestHelperOrchestratorChild is not a test: TestOrchestratorKilled runs
// the test binary again with this test selected, as an orchestrator
// process (reply handler and timers) that kills itself with SIGKILL at
// random persistence boundaries, or is killed by the parent.
func TestHelperOrchestratorChild(t *testing.T) {
	env := os.Getenv(childEnv)
	if env == "" {
		t.Skip("helper process for TestOrchestratorKilled")
	}
	f := strings.Split(env, ";")
	schema, brokers := f[0], strings.Split(f[1], ",")
	seed, _ := strconv.ParseUint(f[5], 10, 64)
	rng := rand.New(rand.NewPCG(seed, 1))
	pool, err := pgtest.Connect(context.Background(), pgtest.URL(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	hook := func(ctx context.Context, p sagahook.Point, id string) error {
		if seed != 0 && rng.IntN(40) == 0 {
			fmt.Printf("killing myself at %s of %s\n", p, id)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		return nil
	}
	o, err := saga.New(pool, saga.Config{Schema: schema, Hook: hook, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{testBundle: &testBundle{tbl: func(name string) string { return sqlident.Table(schema, name) }},
		creditTopic: f[2], stockTopic: f[3], replyTopic: f[4]}
	if err := o.Register(mustDefine(t, e.spec(1, time.Minute))); err != nil {
		t.Fatal(err)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	e.testBundle.t = t
	router := newRouter(t)
	// A fresh consumer group reads the reply topic from the start: what
	// an earlier process applied, the inbox drops.
	retry := &middleware.Retry{MaxRetries: 50, InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond, ShouldRetry: inbox.ShouldRetry}
	if _, err := o.AddToRouter(router, saga.RouterConfig{Subscriber: kafkatest.NewSubscriber(t, brokers), Poison: pub, Retry: retry}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = o.Run(context.Background()) }()
	_ = router.Run(context.Background())
}

// The orchestrator process is killed (SIGKILL) again and again, at random
// persistence boundaries (before or after its commit, between reading a
// reply and writing the next command) and at random times; each new
// process resumes every saga. All end completed or compensated, with the
// participants' effects matching their outcomes exactly.
func TestOrchestratorKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	t.Parallel()
	e := setupE2E(t, true)
	e.participantsOnly = true
	e.failStock = func(id string) bool { return hashFail(id, 30) }
	def := mustDefine(t, e.spec(1, time.Minute))
	e.start(t, def)
	// Sagas keep starting while processes die: 5 before each of the
	// first 30 processes.
	const runs, perRun = 30, 5
	const n = runs * perRun
	var ids []string
	ended := func() int {
		var c int
		if err := e.db.Pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %s WHERE status IN ('completed', 'compensated')`,
			e.tbl("saga_instance"))).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	deadline := time.Now().Add(90 * time.Second)
	kills, selfKills := 0, 0
	for run := 0; run < runs || ended() < n; run++ {
		if run < runs {
			for range perRun {
				id := fmt.Sprintf("crash-%d", len(ids))
				ids = append(ids, id)
				start(t, e.testBundle, def, id, len(ids))
			}
		}
		if time.Now().After(deadline) {
			rows, _ := e.db.Pool.Query(context.Background(), fmt.Sprintf(`SELECT id, status, step, steps::text, last_error FROM %s WHERE status NOT IN ('completed', 'compensated')`, e.tbl("saga_instance")))
			for rows.Next() {
				var id, status, step, steps, lastError string
				_ = rows.Scan(&id, &status, &step, &steps, &lastError)
				t.Logf("%s: %s at %s %s: %s", id, status, step, steps, lastError)
				for _, h := range historyOf(t, e.o, id) {
					t.Logf("   %s %s %s %d %s %s", h.Event, h.Step, h.Operation, h.Attempt, h.Outcome, h.Reason)
				}
			}
			rows.Close()
			t.Fatalf("after %d processes (%d killed by the parent, %d by themselves) only %d of %d sagas ended", run, kills, selfKills, ended(), n)
		}
		childSeed := rng.Uint64() | 1
		if run >= runs {
			childSeed = 0 // enough crashes: let the survivors finish
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOrchestratorChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), childEnv+"="+strings.Join([]string{e.db.Schema, strings.Join(e.brokers, ","),
			e.creditTopic, e.stockTopic, e.replyTopic, strconv.FormatUint(childSeed, 10)}, ";"))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		life := time.Duration(100+rng.IntN(700)) * time.Millisecond
		if run >= runs+5 {
			life = 20 * time.Second // enough crashes: let the survivors finish
		}
		timer := time.NewTimer(life)
		tick := time.NewTicker(50 * time.Millisecond)
	wait:
		for {
			select {
			case <-exited:
				selfKills++
				break wait
			case <-tick.C:
				if run < runs || ended() < n {
					continue
				}
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-exited
				break wait
			case <-timer.C:
				_ = cmd.Process.Signal(syscall.SIGKILL)
				<-exited
				kills++
				break wait
			}
		}
		timer.Stop()
		tick.Stop()
	}
	t.Logf("%d processes killed by the parent, %d killed themselves at a hook point", kills, selfKills)
	if kills+selfKills < runs {
		t.Fatalf("only %d kills: the test did not test much", kills+selfKills)
	}
	for _, id := range ids {
		in := e.waitStatus(id, saga.StatusCompleted, saga.StatusCompensated)
		e.checkEffects(t, in)
		if (in.Status == saga.StatusCompensated) != e.failStock(id) {
			t.Errorf("saga %s: %s (%s)", id, in.Status, in.LastError)
		}
	}
}
