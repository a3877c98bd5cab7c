package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
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
