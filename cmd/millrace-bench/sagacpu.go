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
// broker child and the PostgreSQL backends of a pool: what one saga costs
// the machine, whatever else runs on it.
type cpuMeter struct {
	self, broker time.Duration
}

func processCPU(pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+2:]
	}
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond // clock ticks of 10ms (CLK_TCK 100)
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (b *bench) startCPU() *cpuMeter {
	m := &cpuMeter{self: selfCPU()}
	if b.broker != nil {
		m.broker = processCPU(b.broker.cmd.Process.Pid)
	}
	return m
}

// stop returns the CPU time of this process and the broker since start,
// and the whole CPU time of pool's backends (open since the phase began).
func (m *cpuMeter) stop(ctx context.Context, b *bench, pool *pgxpool.Pool) (self, broker, db time.Duration) {
	self = selfCPU() - m.self
	if b.broker != nil {
		broker = processCPU(b.broker.cmd.Process.Pid) - m.broker
	}
	for _, c := range pool.AcquireAllIdle(ctx) {
		db += processCPU(int(c.Conn().PgConn().PID()))
		c.Release()
	}
	return self, broker, db
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
		group := ""
		if strings.Contains(text, q+".") {
			group = "other"
			for _, g := range pgGroups {
				if strings.Contains(text, fmt.Sprintf(g.match, q)) {
					group = g.name
					break
				}
			}
		} else {
			switch w := strings.ToUpper(strings.Fields(text + " x")[0]); w {
			case "BEGIN", "COMMIT", "ROLLBACK", "SET", "SAVEPOINT", "RELEASE":
				group = "begin_commit"
			}
		}
		if group != "" {
			ms[group] += s.ms
			calls[group] += s.calls
		}
	}
	return ms, calls
}

// pgStatementGroups are the names of pgGroups, in order.
func pgStatementGroups() []string {
	var out []string
	for _, g := range pgGroups {
		out = append(out, g.name)
	}
	return out
}
