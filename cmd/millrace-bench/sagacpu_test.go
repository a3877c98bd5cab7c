package main

import (
	"context"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

// TestClusterCPUCountsEndedBackends checks the saga figures' PostgreSQL
// meter: the CPU of a backend whose connection closed before the reading
// counts (the meter that read one pool's open backends missed every
// connection a phase's stop closed, and reported a tenth of the cost), and
// the wake-ups of a backend that runs statements are read.
func TestClusterCPUCountsEndedBackends(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t, 2)
	pm := postmasterPID(ctx, pool)
	if pm == 0 {
		t.Fatalf("PostgreSQL at %s does not run on this machine: the bench cannot read its CPU (scripts/pg-up.sh starts one that does)", pgtest.URL())
	}
	cpu0, w0 := cluster(pm)

	conn, err := pgx.Connect(ctx, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pid := int(conn.PgConn().PID())
	wakes0 := wakeups(pid)
	// Round trips 2 ms apart: the backend finds no message waiting when it
	// has answered, sleeps and is woken by the next. (Back to back, on
	// busy CPUs, the backend was preempted before it could wait, found the
	// next message there and never slept: no wake-up at all over 200 round
	// trips in a loaded CI run.)
	for range 50 {
		if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	own := wakeups(pid) - wakes0
	if own < 10 {
		t.Errorf("the backend's wake-ups grew by %d over 50 round trips 2 ms apart, want at least 10", own)
	}
	// The cluster's count holds them, whatever other tests' backends did
	// (those that ended drop out; they cannot make it go down).
	if _, w1 := cluster(pm); wakesSince(w0, w1) < own {
		t.Errorf("the cluster's wake-ups grew by %d, less than the %d of one of its backends", wakesSince(w0, w1), own)
	}
	// Work for the backend alone, then close its connection.
	if _, err := conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, 5000000)`); err != nil {
		t.Fatal(err)
	}
	used := processCPU(pid)
	if used < 100*time.Millisecond {
		t.Fatalf("the backend used %s, want at least 100ms of CPU to tell", used)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); os.IsNotExist(err) {
			break // ended and reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend %d still there 10s after its connection closed", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cpu1, _ := cluster(pm)
	if got := cpu1 - cpu0; got < used {
		t.Errorf("the cluster's CPU grew by %s, less than the %s of the backend that ended", got, used)
	}
}

// wakesSince counts the processes alive at the second reading: a
// difference for one read twice, everything for a new one or a reused pid,
// nothing for one that ended.
func TestWakesSince(t *testing.T) {
	t.Parallel()
	start := map[int]int64{1: 100, 2: 50, 3: 900}
	end := map[int]int64{1: 130, 4: 7, 3: 10} // 2 ended; 4 is new; 3's pid was reused
	if got, want := wakesSince(start, end), int64(30+7+10); got != want {
		t.Errorf("wakesSince = %d, want %d", got, want)
	}
	if got := wakesSince(nil, nil); got != 0 {
		t.Errorf("wakesSince of nothing = %d", got)
	}
}

// TestClusterCPUNeverGoesDown reads the cluster's CPU again and again
// while other connections open, work and close: a backend reaped between
// the reading of the postmaster and that of its children was in neither,
// and the reading went down by that backend's CPU (42-49 times in 800
// readings under -race beside three such clients; a CI run failed on it).
func TestClusterCPUNeverGoesDown(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pm := postmasterPID(ctx, pgtest.Pool(t, 1))
	if pm == 0 {
		t.Fatalf("PostgreSQL at %s does not run on this machine: the bench cannot read its CPU (scripts/pg-up.sh starts one that does)", pgtest.URL())
	}
	churn, stop := context.WithCancel(ctx)
	done := make(chan error, 3)
	for range cap(done) {
		go func() {
			for churn.Err() == nil {
				conn, err := pgx.Connect(churn, pgtest.URL())
				if err != nil {
					done <- ignoreStop(churn, err)
					return
				}
				_, err = conn.Exec(churn, `SELECT count(*) FROM generate_series(1, 300000)`)
				conn.Close(context.Background())
				if err != nil {
					done <- ignoreStop(churn, err)
					return
				}
			}
			done <- nil
		}()
	}
	prev, _ := cluster(pm)
	downs := 0
	for range 800 {
		cpu, _ := cluster(pm)
		if cpu < prev {
			downs++
			t.Logf("the cluster's CPU went down by %s", prev-cpu)
		}
		prev = cpu
	}
	stop()
	for range cap(done) {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if downs > 0 {
		t.Errorf("the cluster's CPU went down %d times in 800 readings", downs)
	}
}

func ignoreStop(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// TestMachineCPUCountsThisProcess checks the meter of the machine's busy
// CPU that the saga phases' "anything else" figure is taken from: it
// grows by at least what this process spent (it holds every process),
// within the ticks' granularity.
func TestMachineCPUCountsThisProcess(t *testing.T) {
	busy0, steal0 := machineCPU()
	own0, _ := selfUsage()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
	}
	busy1, steal1 := machineCPU()
	own, _ := selfUsage()
	own -= own0
	if busy0 == 0 || busy1-busy0 < own-30*time.Millisecond {
		t.Errorf("the machine's busy CPU grew by %v while this process spent %v; want at least that (readings %v, %v)", busy1-busy0, own, busy0, busy1)
	}
	if steal1 < steal0 {
		t.Errorf("stolen time went down: %v then %v", steal0, steal1)
	}
}

// TestStatementsPerSagaByGroup checks the saga latency phases' count of
// statements: each statement of a batch counts, not only the batch, and
// each goes to the group of the table it names, the transaction's own
// statements (the relay's settings among them) to begin_commit.
func TestStatementsPerSagaByGroup(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := pgtest.New(t)
	trips := &pgtest.RoundTrips{Texts: true}
	pool, err := pgtest.ConnectTraced(ctx, pgtest.URL(), 1, trips)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	q := sqlident.Quote(db.Schema)
	before := trips.Statements()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SELECT set_config('enable_hashjoin', 'off', true), set_config('synchronous_commit', 'off', true)")
	b.Queue(`SELECT count(*) FROM ` + q + `."outbox_pending"`)
	b.Queue(`SELECT count(*) FROM ` + q + `."saga_instance"`)
	b.Queue(`SELECT count(*) FROM ` + q + `."processed_event"`)
	b.Queue(`SELECT count(*) FROM ` + q + `."schema_migration"`)
	b.Queue("SELECT 1")
	if err := pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := pool.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}
	if n := trips.N(); n != 3 {
		t.Errorf("%d round trips, want 3 (a batch and two statements)", n)
	}
	got := statementsPerSaga(before, trips.Statements(), db.Schema, 2)
	want := map[string]float64{"total": 4.5, "begin_commit": 2, "relay_claim_mark": 0.5, "saga_load_save": 0.5, "inbox_dedup": 0.5, "other": 1}
	if !maps.Equal(got, want) {
		t.Errorf("statements per saga over 2 sagas: %v, want %v", got, want)
	}
	if line := statementsLine(got); !strings.HasPrefix(line, "4.5 statements, inbox_dedup 0.5, saga_load_save 0.5, relay_claim_mark 0.5, begin_commit 2.0, other 1.0") {
		t.Errorf("progress line %q", line)
	}
}
