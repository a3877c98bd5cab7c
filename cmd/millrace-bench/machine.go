package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

// wakeupRoundTrips is how many one-byte round trips machineWakeup times.
const wakeupRoundTrips = 2000

// serveEcho is the -echo child: it writes back each byte it reads, until
// EOF on stdin. Its reads block in the kernel (Fd puts the descriptors in
// blocking mode), so that each one is a real sleep and wake-up, not a poll
// that Go's scheduler might catch while spinning.
func serveEcho(stdin, stdout *os.File) error {
	in, out := int(stdin.Fd()), int(stdout.Fd())
	buf := make([]byte, 1)
	for {
		if n, err := syscall.Read(in, buf); n != 1 || err != nil {
			return nil
		}
		if _, err := syscall.Write(out, buf); err != nil {
			return err
		}
	}
}

// machineWakeup times one-byte round trips through pipes to a child
// process (the -echo child), with a pause before each so that the child's
// CPU goes idle: each is two wake-ups of a blocked process, what every
// round trip to PostgreSQL or the broker pays besides its work. It returns
// the median. On the virtual machines this bench runs on, waking an idle
// CPU costs tens of times what a ping-pong between two busy ones does
// (120 against 5 µs seen on one machine), and it drifts between days, and
// every saga figure with it: the results record it beside them
// (config.machine_wakeup_round_trip_us).
func machineWakeup(ctx context.Context) (time.Duration, error) {
	cmd, err := child(ctx, "-echo")
	if err != nil {
		return 0, err
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start the echo child: %w", err)
	}
	defer func() { _ = in.Close(); _ = cmd.Wait() }()
	// Blocking reads and writes, as the child's.
	wfd, rfd := int(in.(*os.File).Fd()), int(out.(*os.File).Fd())
	ds := make([]time.Duration, 0, wakeupRoundTrips)
	b := []byte{'x'}
	for range wakeupRoundTrips + 100 {
		// The child's CPU goes idle between round trips, as a service's
		// do between messages: waking an idle CPU is the expensive part.
		time.Sleep(200 * time.Microsecond)
		t := time.Now()
		if _, err := syscall.Write(wfd, b); err != nil {
			return 0, err
		}
		if n, err := syscall.Read(rfd, b); n != 1 || err != nil {
			return 0, fmt.Errorf("echo child: read %d bytes: %v", n, err)
		}
		ds = append(ds, time.Since(t))
	}
	ds = ds[100:] // the first ones warm up
	slices.Sort(ds)
	return ds[len(ds)/2], nil
}

// cpuProbeRuns is how many times cpuProbe runs its workload.
const cpuProbeRuns = 9

// cpuProbe times a fixed piece of single-threaded work, of the kind the
// saga rig's processes do between round trips (filling a hash map,
// sorting, hashing bytes), and returns the median of cpuProbeRuns runs,
// about 4 ms each on an idle core of the machine it was written on. The
// same build's saga figures moved by a factor of two within minutes on
// this bench's virtual machines, with PostgreSQL's execution time per
// saga moving with them: the figure, read before each saga latency phase,
// says how fast the CPUs were then (lower is faster).
func cpuProbe() time.Duration {
	ds := make([]time.Duration, cpuProbeRuns)
	for i := range ds {
		t := time.Now()
		cpuProbeWork()
		ds[i] = time.Since(t)
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// cpuProbeSink keeps cpuProbeWork's result alive.
var cpuProbeSink uint64

func cpuProbeWork() {
	const n = 1 << 15
	x := uint64(88172645463325252)
	next := func() uint64 { // xorshift64: the same numbers every run
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	m := make(map[uint64]uint32, n/4) // grows: rehashes, as maps do
	s := make([]uint64, n)
	for i := range s {
		s[i] = next()
		m[s[i]%(n/2)]++
	}
	slices.Sort(s)
	buf := make([]byte, 8*n)
	for i, v := range s {
		for j := range 8 {
			buf[8*i+j] = byte(v >> (8 * j))
		}
	}
	sum := sha256.Sum256(buf)
	cpuProbeSink += uint64(len(m)) + uint64(sum[0])
}
