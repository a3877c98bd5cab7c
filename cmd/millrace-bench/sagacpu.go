package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
)

// cpuMeter adds up the CPU time spent for a phase by this process, the
// broker child and the PostgreSQL cluster, and how often their threads
// blocked and were woken again (voluntary context switches): what one
// saga costs the machine, whatever else runs on it. On a virtual machine
// a wake-up costs far more than on bare metal, and its cost drifts: the
// wake-ups per saga say how much of the CPU per saga is that.
type cpuMeter struct {
	start      usage
	brokerPID  int // 0 with a broker outside this bench (KAFKA_BROKERS)
	postmaster int // 0 when PostgreSQL's processes cannot be read (not on this machine)
}

// usage is a reading of the three processes: CPU time and wake-ups, in
// the order bench process, broker, PostgreSQL.
type usage struct {
	cpu   [3]time.Duration
	wakes [3]int64
	// pgWakes are the wake-ups of the cluster's processes by pid
	// (wakes[2] is their sum since the start, in stop's usage).
	pgWakes map[int]int64
	// busy is the CPU time all the machine's CPUs spent running anything
	// (the three above, other processes and the kernel's interrupts), and
	// steal the time the hypervisor gave them to other guests: 0 where
	// /proc/stat cannot be read.
	busy, steal time.Duration
}

// clockTick is the unit of the CPU times in /proc (CLK_TCK 100).
const clockTick = 10 * time.Millisecond

// machineCPU reads the first line of /proc/stat: the busy CPU time of
// all the machine's CPUs (user, nice, system, irq and softirq; guest time
// is in user) and their steal time.
func machineCPU() (busy, steal time.Duration) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	n := func(i int) time.Duration { v, _ := strconv.ParseInt(f[i], 10, 64); return time.Duration(v) }
	return (n(1) + n(2) + n(3) + n(6) + n(7)) * clockTick, n(8) * clockTick
}

// procStat returns a process's parent pid, its own CPU time and the CPU
// time of its children that ended and were waited for (the kernel adds
// theirs to the parent's when it reaps them).
func procStat(pid int) (ppid int, own, children time.Duration, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 15 {
		return 0, 0, 0, false
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	return int(n(1)), time.Duration(n(11)+n(12)) * clockTick, time.Duration(n(13)+n(14)) * clockTick, true
}

// wakeups returns the voluntary context switches of every thread of a
// process.
func wakeups(pid int) int64 {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var total int64
	for _, t := range tasks {
		data, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				total += n
			}
		}
	}
	return total
}

func processCPU(pid int) time.Duration {
	_, own, _, _ := procStat(pid)
	return own
}

// cluster reads a PostgreSQL cluster: the CPU time of its postmaster,
// every process it runs now (backends, WAL writer, checkpointer,
// autovacuum...) and those that ended (counted in the postmaster's
// children's time once reaped), and the wake-ups of each process it runs
// now, by pid (those of an ended process are lost: wakesSince counts what
// the processes alive at the end did). Reading the CPU of one pool's
// backends alone missed every connection that closed before the reading:
// pgx closes a connection whose query a cancelled context interrupted,
// which is how every phase stops.
//
// A child reaped while the others are read would be in neither the
// postmaster's children's time read before nor among the live processes
// (other clients' backends end at any time on a shared server), so a
// reading is taken again when the postmaster reaped during it (ten
// readings at most: the last one stands).
func cluster(postmaster int) (cpu time.Duration, wakes map[int]int64) {
	for try := 0; ; try++ {
		cpu, wakes, reaped := clusterOnce(postmaster)
		if wakes == nil {
			return 0, nil
		}
		if _, _, after, ok := procStat(postmaster); !ok || after == reaped || try == 9 {
			return cpu, wakes
		}
	}
}

func clusterOnce(postmaster int) (cpu time.Duration, wakes map[int]int64, reaped time.Duration) {
	_, own, reaped, ok := procStat(postmaster)
	if !ok {
		return 0, nil, 0
	}
	cpu, wakes = own+reaped, map[int]int64{postmaster: wakeups(postmaster)}
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return cpu, wakes, reaped
	}
	for _, e := range dir {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == postmaster {
			continue
		}
		if ppid, own, _, ok := procStat(pid); ok && ppid == postmaster {
			cpu += own
			wakes[pid] = wakeups(pid)
		}
	}
	return cpu, wakes, reaped
}

// wakesSince returns the wake-ups that the processes of end did since
// start: for one read in both, the difference; for one new since start (or
// whose pid was reused: fewer than before), all of its own. A process that
// ended between the readings is not in end, and its wake-ups are lost:
// the sum never goes down because another client's backends ended during
// the phase, as a difference of two sums did on a shared server.
func wakesSince(start, end map[int]int64) int64 {
	var n int64
	for pid, w := range end {
		if s, ok := start[pid]; ok && s <= w {
			w -= s
		}
		n += w
	}
	return n
}

// postmasterPID returns the pid of the PostgreSQL server pool talks to
// when it runs on this machine (the parent of a backend whose /proc entry
// is a postgres process), else 0.
func postmasterPID(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(backend) + "/comm")
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return 0
	}
	ppid, _, _, ok := procStat(backend)
	if !ok {
		return 0
	}
	return ppid
}

func selfUsage() (time.Duration, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw
}

func (b *bench) startCPU(ctx context.Context, pool *pgxpool.Pool) *cpuMeter {
	m := &cpuMeter{postmaster: postmasterPID(ctx, pool)}
	if b.broker != nil {
		m.brokerPID = b.broker.cmd.Process.Pid
	}
	m.start = m.read()
	return m
}

func (m *cpuMeter) read() usage {
	var u usage
	u.busy, u.steal = machineCPU()
	u.cpu[0], u.wakes[0] = selfUsage()
	if m.brokerPID != 0 {
		u.cpu[1], u.wakes[1] = processCPU(m.brokerPID), wakeups(m.brokerPID)
	}
	if m.postmaster != 0 {
		u.cpu[2], u.pgWakes = cluster(m.postmaster)
	}
	return u
}

// stop returns the CPU time and the wake-ups of this process, the broker
// and the PostgreSQL cluster since start; the broker's and the cluster's
// are 0 when they run elsewhere.
func (m *cpuMeter) stop() usage {
	u := m.read()
	for i := range u.cpu {
		u.cpu[i] -= m.start.cpu[i]
		u.wakes[i] -= m.start.wakes[i]
	}
	u.busy -= m.start.busy
	u.steal -= m.start.steal
	u.wakes[2] = wakesSince(m.start.pgWakes, u.pgWakes)
	return u
}

// pgStatements is a snapshot of pg_stat_statements: per statement text,
// calls and execution time (ms). Empty (with ok false) when the extension
// cannot be used: it needs shared_preload_libraries (scripts/pg-up.sh sets
// it on its throwaway cluster).
type pgStatements map[string]pgStatement

type pgStatement struct {
	calls int64
	ms    float64
}

func readPgStatements(ctx context.Context, pool *pgxpool.Pool) (pgStatements, bool) {
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return nil, false
	}
	rows, err := pool.Query(ctx, `SELECT query, sum(calls)::int8, sum(total_exec_time)::float8
  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) GROUP BY query`)
	if err != nil {
		return nil, false
	}
	defer rows.Close()
	out := pgStatements{}
	for rows.Next() {
		var q string
		var s pgStatement
		if err := rows.Scan(&q, &s.calls, &s.ms); err != nil {
			return nil, false
		}
		out[q] = s
	}
	return out, rows.Err() == nil
}

// pgGroups are the statement groups of the saga figures, matched in order
// on a statement's text; a statement naming none of the schema's tables
// counts only if it is one of the transaction statements (BEGIN, COMMIT,
// SET, ...: all sessions of the database, so other activity on it is in
// there too).
var pgGroups = []struct{ name, match string }{
	{"outbox_write", `INSERT INTO %s."outbox_event"`},
	{"inbox_dedup", `%s."processed_event"`},
	{"barrier", `%s."compensation_barrier"`},
	{"saga_load_save", `%s."saga_`},
	{"relay_claim_mark", `%s."outbox_`},
	{"effect_row", `%s."bench_saga_effect"`},
}

// pgCost returns, per statement group, the execution time and calls that
// after added to before for the statements of schema.
func pgCost(before, after pgStatements, schema string) (ms map[string]float64, calls map[string]int64) {
	ms, calls = map[string]float64{}, map[string]int64{}
	q := sqlident.Quote(schema)
	for text, s := range after {
		s.calls -= before[text].calls
		s.ms -= before[text].ms
		if s.calls <= 0 {
			continue
		}
		group := stmtGroup(text, q)
		if group != "" {
			ms[group] += s.ms
			calls[group] += s.calls
		}
	}
	return ms, calls
}

// stmtGroup is the group of a statement's text, q the quoted schema: the
// first of pgGroups it matches if it names one of the schema's tables,
// "other" if it names one but matches none, "begin_commit" for the
// transaction statements and the relay's settings of its transactions,
// which name no table, and "" for the rest.
func stmtGroup(text, q string) string {
	if strings.Contains(text, q+".") {
		for _, g := range pgGroups {
			if strings.Contains(text, fmt.Sprintf(g.match, q)) {
				return g.name
			}
		}
		return "other"
	}
	f := strings.Fields(strings.ToUpper(text) + " x x")
	switch f[0] {
	case "BEGIN", "COMMIT", "ROLLBACK", "SET", "SAVEPOINT", "RELEASE":
		return "begin_commit"
	case "SELECT":
		if strings.HasPrefix(f[1], "SET_CONFIG(") {
			return "begin_commit"
		}
	}
	return ""
}

// statementsPerSaga is what a phase sent to PostgreSQL through its pool,
// per saga: the statements that after (by text, pgtest.RoundTrips.Texts)
// added to before, by stmtGroup ("other" for a statement that fits none),
// and their "total".
func statementsPerSaga(before, after map[string]int64, schema string, sagas int) map[string]float64 {
	q := sqlident.Quote(schema)
	n := map[string]int64{}
	for text, c := range after {
		c -= before[text]
		if c <= 0 {
			continue
		}
		g := stmtGroup(text, q)
		if g == "" {
			g = "other"
		}
		n[g] += c
		n["total"] += c
	}
	out := map[string]float64{}
	for g, c := range n {
		out[g] = round(float64(c)/float64(sagas), 1)
	}
	return out
}

// statementsLine is statementsPerSaga's figures for a progress line: the
// total, then each group in the order of pgGroups.
func statementsLine(per map[string]float64) string {
	parts := []string{fmt.Sprintf("%.1f statements", per["total"])}
	for _, g := range reportedGroups() {
		if per[g] > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f", g, per[g]))
		}
	}
	return strings.Join(parts, ", ")
}

// reportedGroups are every group stmtGroup names, in the order the
// progress lines give them: pgGroups, then begin_commit and other.
func reportedGroups() []string { return append(pgStatementGroups(), "begin_commit", "other") }

// pgStatementGroups are the names of pgGroups, in order.
func pgStatementGroups() []string {
	var out []string
	for _, g := range pgGroups {
		out = append(out, g.name)
	}
	return out
}
