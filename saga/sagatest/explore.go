package sagatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/sagahook"
)

// Scenario sets up one run on a fresh harness: it registers definitions
// and participants, creates the participants' tables (in h.Schema(), which
// is emptied before every run) and starts sagas; Explore then runs it with
// a fault plan and checks the invariants. It is called once per run, so
// it must start the same sagas every time.
type Scenario func(h *H) error

// ExploreConfig configures Explore.
type ExploreConfig struct {
	// Config is each run's harness configuration (Effects, Check, Saga,
	// ...). Its Faults, if set, are injected in every run, before the
	// explored ones (a Script that loses a command, say, so that the runs
	// explore crashes in the timers it makes fire); the shrinking may drop
	// them too.
	Config Config
	// Seed is where the random runs start: run i draws its faults from
	// Seed+i. Defaults to $SAGATEST_SEED if set (to repeat a failure
	// Explore printed), else a seed from the time, which a failure prints.
	Seed uint64
	// Runs is the number of random runs. Defaults to 100; a negative
	// value runs none.
	Runs int
	// Enumerate first runs the scenario once with no fault, then once per
	// event of that run and fault kind that applies to it (a crash at each
	// hook point), among Random.Kinds: every single fault, systematically.
	// Defaults to false.
	Enumerate bool
	// Random shapes the random runs' faults.
	Random RandomOptions
	// MaxShrinkRuns bounds the runs spent shrinking a failure. Defaults
	// to 200.
	MaxShrinkRuns int
	// Workers is the number of runs at once, each on a schema of its own
	// with up to 5 connections. Runs mostly wait on PostgreSQL: 4 workers
	// finish about twice as fast as 2, even on two cores. Defaults to 2.
	Workers int
	// Log, if set, receives one line per run (from several goroutines).
	Log func(format string, args ...any)
}

// Failure is a run that broke an invariant, shrunk: Faults is the smallest
// list of faults found that still breaks it (Script(Faults...) repeats it).
type Failure struct {
	// Seed is the failing random run's seed (0 for an enumerated run).
	Seed uint64
	// Original is the faults of the failing run before shrinking.
	Original []Fault
	// Faults is the smallest failing fault list; Report its run.
	Faults []Fault
	Report *Report
	// Runs is how many runs the exploration took.
	Runs int
}

func (f *Failure) String() string {
	var b strings.Builder
	if f.Seed == 0 {
		b.WriteString("an enumerated run: ")
	} else {
		fmt.Fprintf(&b, "seed %d: ", f.Seed)
	}
	fmt.Fprintf(&b, "%d faults, shrunk to %d:\n", len(f.Original), len(f.Faults))
	for _, x := range f.Faults {
		fmt.Fprintf(&b, "\t%s\n", x)
	}
	fmt.Fprintf(&b, "replay: sagatest.Script(%s)\n", goFaults(f.Faults))
	b.WriteString(f.Report.String())
	return b.String()
}

// goFaults writes faults as Go, for a regression test.
func goFaults(fs []Fault) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		ev := f.At
		at := fmt.Sprintf("sagatest.Event{Kind: %q, Saga: %q, Step: %q, Op: %q, Attempt: %d, Consumer: %q, Seq: %d}",
			ev.Kind, ev.Saga, ev.Step, ev.Op, ev.Attempt, ev.Consumer, ev.Seq)
		parts[i] = fmt.Sprintf("sagatest.Fault{Kind: %q, At: %s, Times: %d, Point: %d}", f.Kind, at, f.Times, f.Point)
	}
	return strings.Join(parts, ", ")
}

// envSeed returns $SAGATEST_SEED, or a seed from the time.
func envSeed() uint64 {
	if s, err := strconv.ParseUint(os.Getenv("SAGATEST_SEED"), 10, 64); err == nil && s != 0 {
		return s
	}
	return uint64(time.Now().UnixNano())
}

// Explore runs scenario many times with faults (see ExploreConfig) and
// fails t with the smallest failing fault list it finds, the seed to
// repeat it and the run's trace.
func Explore(t testing.TB, cfg ExploreConfig, scenario Scenario) {
	t.Helper()
	if cfg.Seed == 0 {
		cfg.Seed = envSeed()
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	t.Logf("sagatest: explore from seed %d", cfg.Seed)
	f, err := FindFailure(context.Background(), cfg, scenario)
	if err != nil {
		t.Fatalf("sagatest: explore (seed %d): %v", cfg.Seed, err)
	}
	if f != nil {
		t.Fatalf("sagatest: invariants violated after %d runs, %s", f.Runs, f)
	}
}

// FindFailure is Explore for code that wants the failure: it returns nil
// when every run kept the invariants, and an error when a run could not be
// set up (the scenario failed, PostgreSQL is away).
func FindFailure(ctx context.Context, cfg ExploreConfig, scenario Scenario) (*Failure, error) {
	cfg = cfg.withDefaults()
	xs := make([]*explorer, cfg.Workers)
	defer func() {
		for _, x := range xs {
			if x != nil {
				x.env.close()
			}
		}
	}()
	for i := range xs {
		e, err := newEnv(ctx)
		if err != nil {
			return nil, err
		}
		xs[i] = &explorer{ctx: ctx, env: e, cfg: cfg, scenario: scenario}
	}
	var jobs []exploreJob
	if cfg.Enumerate {
		enumerated, f, err := xs[0].enumerate()
		if err != nil || f != nil {
			return f, err
		}
		jobs = enumerated
	}
	for i := range max(cfg.Runs, 0) {
		seed := cfg.Seed + uint64(i)
		jobs = append(jobs, exploreJob{seed: seed, plan: Random(seed, cfg.Random)})
	}
	return runJobs(xs, jobs, cfg.Log)
}

func (cfg ExploreConfig) withDefaults() ExploreConfig {
	if cfg.Runs == 0 {
		cfg.Runs = 100
	}
	if cfg.MaxShrinkRuns == 0 {
		cfg.MaxShrinkRuns = 200
	}
	if cfg.Seed == 0 {
		cfg.Seed = envSeed()
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	return cfg
}

// exploreJob is one run of an exploration: a fault plan, and the seed of a
// random one.
type exploreJob struct {
	seed uint64
	plan Faults
}

// enumerate runs the scenario without faults and returns a job for each
// fault of the configured kinds at each event of that run (each crash
// point for a crash), or the failure of the run without faults.
func (x *explorer) enumerate() ([]exploreJob, *Failure, error) {
	base, err := x.run(noFaults{})
	if err != nil {
		return nil, nil, err
	}
	if len(base.Violations) > 0 {
		return nil, x.fail(0, nil, base), nil
	}
	kinds := x.cfg.Random.Kinds
	if len(kinds) == 0 {
		kinds = AllFaults
	}
	var jobs []exploreJob
	for _, ev := range x.events {
		for _, kind := range applies(ev.Kind) {
			if !slices.Contains(kinds, kind) {
				continue
			}
			if kind == Crash {
				for p := sagahook.Loaded; p <= sagahook.AfterCommit; p++ {
					jobs = append(jobs, exploreJob{plan: Script(CrashAt(p, ev))})
				}
				continue
			}
			jobs = append(jobs, exploreJob{plan: Script(Fault{Kind: kind, At: ev})})
		}
	}
	return jobs, nil, nil
}

// runJobs runs jobs on the explorers, each taking the next, and returns
// the failure of the first job (in order) that fails, shrunk, or nil; a
// job after a failing one is not started.
func runJobs(xs []*explorer, jobs []exploreJob, log func(string, ...any)) (*Failure, error) {
	var (
		next   atomic.Int64
		mu     sync.Mutex
		first  = -1
		failed struct {
			x *explorer
			r *Report
		}
		setupErr error
		wg       sync.WaitGroup
	)
	for _, x := range xs {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				mu.Lock()
				stop := i >= len(jobs) || (first >= 0 && i > first) || setupErr != nil
				mu.Unlock()
				if stop {
					return
				}
				r, err := x.run(jobs[i].plan)
				mu.Lock()
				switch {
				case err != nil:
					setupErr = errors.Join(setupErr, fmt.Errorf("seed %d: %w", jobs[i].seed, err))
				case len(r.Violations) > 0 && (first < 0 || i < first):
					first, failed.x, failed.r = i, x, r
				}
				mu.Unlock()
				if err == nil {
					log("sagatest: run %d (seed %d): %d events, %d faults, %d violations", i, jobs[i].seed, r.Events, len(r.Faults), len(r.Violations))
				}
			}
		})
	}
	wg.Wait()
	if setupErr != nil {
		return nil, setupErr
	}
	if first < 0 {
		return nil, nil
	}
	f := failed.x.fail(jobs[first].seed, failed.r.Faults, failed.r)
	for _, x := range xs {
		if x != failed.x {
			f.Runs += x.runs
		}
	}
	return f, nil
}

type explorer struct {
	ctx      context.Context
	env      *env
	cfg      ExploreConfig
	scenario Scenario
	runs     int
	// events are the events of the last run without faults (Enumerate).
	events []Event
}

// run runs the scenario once on an emptied schema.
func (x *explorer) run(plan Faults) (*Report, error) {
	x.runs++
	if err := x.env.reset(x.ctx); err != nil {
		return nil, fmt.Errorf("sagatest: reset: %w", err)
	}
	cfg := x.cfg.Config
	if cfg.Faults != nil {
		cfg.Faults = combined{cfg.Faults, plan}
	} else {
		cfg.Faults = plan
	}
	h, err := newH(x.ctx, x.env, cfg)
	if err != nil {
		return nil, err
	}
	if err := x.scenario(h); err != nil {
		return nil, fmt.Errorf("sagatest: scenario: %w", err)
	}
	rec := &recorder{planner: h.plan}
	h.plan = rec
	r := h.RunE()
	x.events = rec.events
	return r, nil
}

// combined injects the faults of a fixed plan, and of an explored one
// where the fixed one has none.
type combined struct{ fixed, explored Faults }

func (c combined) newPlanner() planner {
	return &combinedPlanner{c.fixed.newPlanner(), c.explored.newPlanner()}
}

type combinedPlanner struct{ fixed, explored planner }

func (c *combinedPlanner) fault(ev Event, allowed []FaultKind) (Fault, bool) {
	if f, ok := c.fixed.fault(ev, allowed); ok {
		return f, true
	}
	return c.explored.fault(ev, allowed)
}

// recorder notes every event a planner is asked about.
type recorder struct {
	planner
	events []Event
}

func (r *recorder) fault(ev Event, allowed []FaultKind) (Fault, bool) {
	r.events = append(r.events, ev)
	return r.planner.fault(ev, allowed)
}

// fail shrinks a failing run's faults: it drops faults one at a time (then
// lowers Error and Delay counts) while the run still fails, until no single change
// keeps it failing, or the shrink budget is spent.
func (x *explorer) fail(seed uint64, faults []Fault, r *Report) *Failure {
	f := &Failure{Seed: seed, Original: slices.Clone(faults), Faults: slices.Clone(faults), Report: r}
	budget := x.cfg.MaxShrinkRuns
	try := func(cand []Fault) bool {
		if budget <= 0 {
			return false
		}
		budget--
		rr, err := x.run(Script(cand...))
		if err != nil || len(rr.Violations) == 0 {
			return false
		}
		f.Faults, f.Report = rr.Faults, rr
		return true
	}
	for changed := true; changed && budget > 0; {
		changed = false
		for i := 0; i < len(f.Faults) && budget > 0; i++ {
			cand := slices.Delete(slices.Clone(f.Faults), i, i+1)
			if try(cand) {
				changed = true
				i--
			}
		}
		for i := 0; i < len(f.Faults) && budget > 0; i++ {
			if (f.Faults[i].Kind == Error || f.Faults[i].Kind == Delay) && f.Faults[i].Times > 1 {
				cand := slices.Clone(f.Faults)
				cand[i].Times--
				if try(cand) {
					changed = true
				}
			}
		}
	}
	f.Runs = x.runs
	return f
}
