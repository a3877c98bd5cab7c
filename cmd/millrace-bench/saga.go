package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/millrace/millrace"
	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/saga"
)

// The saga group's sizes.
const (
	sagaStarters    = 4    // goroutines starting sagas
	sagaStartBatch  = 50   // sagas started per transaction in the throughput phase
	sagaMaxInFlight = 3000 // started and not ended, at most, in the throughput phase
	// How often the throughput phase counts the completed sagas. Every
	// 50ms, the count (a scan of saga_instance, 8ms at 10,000 sagas) took
	// 5% of PostgreSQL's execution time in the phase (2% every 250ms); a
	// quarter second is under 300 sagas of the cap above at this
	// machine's rate.
	sagaCountEvery    = 250 * time.Millisecond
	sagaLatencyPhases = 3   // latency phases, their median reported
	sagaBatchSize     = 500 // replies or commands per transaction
)

// Quick mode (BENCH_QUICK=1) measures sagas_per_s on a fixed number of
// sagas run to completion, not on the completions within a phase: a short
// phase is no longer than one saga's latency on a loaded machine (seconds),
// and would count none.
const (
	sagaQuickCount    = 200              // sagas started at once
	sagaQuickDeadline = 90 * time.Second // for all of them to complete
)

// sagaFetchWait is the consumers' SubscriberConfig.FetchMaxWait: the
// longest a fetch waits on the broker for records (it answers as soon as
// it has some). The batches close when a fetch is drained: no hop waits on
// a fixed interval when work is there.
const sagaFetchWait = kafka.DefaultFetchMaxWait

// sagaPartitions is the number of partitions of the saga topics.
const sagaPartitions = 32

// sagaOrder is the benchmark saga's data.
type sagaOrder struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// benchSagas measures sagas_per_s: three-step sagas (three remote steps,
// each to a participant built with package compensation that passes its
// barrier and writes a row) completed per second, end to end through the
// outbox, the relay, the broker and the inbox, with the orchestrator
// (RunBatched), the participants (batched too) and the relay in this
// process; and saga_latency_p50_ms / p99 from start to completion at a
// steady rate (-saga-rate, 200 by default) sagas per second.
func (b *bench) benchSagas(ctx context.Context) error {
	n, err := b.sagaPhase(ctx, "throughput", 0, false)
	if err != nil {
		return err
	}
	digits := 0
	if b.opts.quick {
		digits = 1 // a few sagas a second on a loaded machine still show
		b.config["saga_quick_sagas"] = sagaQuickCount
	}
	b.results["sagas_per_s"] = round(n, digits)
	cpu, pgExec := b.sagaCPU(), b.config["saga_pg_exec_ms_per_saga"]
	wakes := map[string]any{}
	for k, v := range b.config {
		if strings.HasPrefix(k, "saga_wakeups_per_saga_") {
			wakes[k] = v
		}
	}
	// The same saga with its middle step a wait step, signalled by the
	// starter: what a wait costs against a remote step.
	wn, err := b.sagaPhase(ctx, "wait", 0, false)
	if err != nil {
		return err
	}
	b.results["sagas_per_s_wait_step"] = round(wn, digits)
	waitCPU := b.sagaCPU()
	b.config["saga_wait_phase_cpu_ms_per_saga"] = waitCPU
	b.config["saga_cpu_ms_per_saga_bench_process"] = cpu[0] // the three-remote-step figures stay the headline
	b.config["saga_cpu_ms_per_saga_broker"] = cpu[1]
	b.config["saga_cpu_ms_per_saga_postgres"] = cpu[2]
	maps.Copy(b.config, wakes)
	if v, ok := b.config["saga_pg_exec_ms_per_saga"]; ok && pgExec != nil {
		b.config["saga_wait_phase_pg_exec_ms_per_saga"] = v
		b.config["saga_pg_exec_ms_per_saga"] = pgExec
	}
	// What a wait step in place of a remote step saves per saga (CPU of
	// the bench process, the broker and PostgreSQL together).
	b.results["saga_wait_step_saves_cpu_ms"] = round(cpu[0]+cpu[1]+cpu[2]-waitCPU[0]-waitCPU[1]-waitCPU[2], 3)
	b.progress("sagas: a wait step in place of a remote step: %.0f sagas/s against %.0f, CPU per saga %.2f ms against %.2f (process, broker and PostgreSQL)",
		wn, n, waitCPU[0]+waitCPU[1]+waitCPU[2], cpu[0]+cpu[1]+cpu[2])
	return b.benchSagaLatency(ctx)
}

// benchSagaLatency runs the saga group's latency phases: the last part of
// the saga group, or the saga-latency group alone.
func (b *bench) benchSagaLatency(ctx context.Context) error {
	if err := b.sagaLatency(ctx); err != nil {
		return err
	}
	b.config["saga_steps"] = 3
	b.config["saga_partitions"] = sagaPartitions
	b.config["saga_batch_size"] = sagaBatchSize
	b.config["saga_latency_rate_per_s"] = b.opts.sagaRate
	return nil
}

// sagaLatency runs sagaLatencyPhases latency phases (one in quick mode)
// and reports the median of their p50s and the median of their p99s: a
// phase is 10 seconds, and the speed of this kind of machine drifts over
// minutes. The hops and the CPU per saga are those of the phase with the
// median p50; every phase's pair is in config.saga_latency_phases.
func (b *bench) sagaLatency(ctx context.Context) error {
	phases := sagaLatencyPhases
	if b.opts.quick {
		phases = 1
	}
	type run struct {
		p50, p99 float64
		results  map[string]float64
		config   map[string]any
	}
	var runs []run
	if !b.opts.quick {
		// One phase at a quarter of the rate first: the machine is far from
		// saturated there, so its latency is the hops' own cost, without
		// the queueing for a CPU that the 200/s phases add on a slow day.
		probe := ms(cpuProbe())
		if _, err := b.sagaPhase(ctx, "latency", b.opts.sagaRate/4, false); err != nil {
			return err
		}
		low := map[string]any{"rate_per_s": b.opts.sagaRate / 4,
			"p50_ms": b.results["saga_latency_p50_ms"], "p99_ms": b.results["saga_latency_p99_ms"], "cpu_probe_ms": probe}
		for k, v := range b.config {
			if latencyMeter(k) {
				low[strings.TrimPrefix(k, "saga_latency_")] = v
			}
		}
		b.config["saga_latency_low_rate"] = low
		b.progress("sagas (latency): at %d sagas/s: p50 %.1f ms, p99 %.1f ms", b.opts.sagaRate/4, low["p50_ms"], low["p99_ms"])
	}
	var probes []float64
	for i := range phases {
		// How fast the CPUs are as the phase begins (the rig of the phase
		// before has stopped).
		probe := cpuProbe()
		probes = append(probes, ms(probe))
		if _, err := b.sagaPhase(ctx, "latency", b.opts.sagaRate, false); err != nil {
			return err
		}
		r := run{p50: b.results["saga_latency_p50_ms"], p99: b.results["saga_latency_p99_ms"], results: map[string]float64{}, config: map[string]any{}}
		for k, v := range b.config {
			if latencyMeter(k) {
				r.config[k] = v
			}
		}
		runs = append(runs, r)
		b.progress("sagas (latency): phase %d of %d: p50 %.1f ms, p99 %.1f ms (CPU probe before it: %s)", i+1, phases, r.p50, r.p99, probe.Round(time.Microsecond))
	}
	var pairs [][2]float64
	p99s := make([]float64, len(runs))
	for i, r := range runs {
		pairs = append(pairs, [2]float64{r.p50, r.p99})
		p99s[i] = r.p99
	}
	slices.Sort(p99s)
	slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.p50, b.p50) })
	mid := runs[len(runs)/2]
	// One more phase at the same rate, with a recorder around the service's
	// publisher and subscriber (the same kafka defaults), breaks a round
	// trip into its hops: its figures are reported beside the phases',
	// not among them.
	if _, err := b.sagaPhase(ctx, "latency", b.opts.sagaRate, true); err != nil {
		return err
	}
	b.config["saga_hops_phase_p50_p99_ms"] = [2]float64{b.results["saga_latency_p50_ms"], b.results["saga_latency_p99_ms"]}
	for k := range b.config {
		if latencyMeter(k) {
			delete(b.config, k)
		}
	}
	b.results["saga_latency_p50_ms"], b.results["saga_latency_p99_ms"] = mid.p50, p99s[len(p99s)/2]
	maps.Copy(b.results, mid.results)
	maps.Copy(b.config, mid.config)
	b.config["saga_latency_phases"] = pairs
	b.config["saga_latency_phase_cpu_probe_ms"] = probes
	return nil
}

// latencyMeter reports whether config key k is a latency phase's CPU,
// wake-ups, round trips or statements to PostgreSQL per saga, or messages
// per transaction.
func latencyMeter(k string) bool {
	return strings.HasPrefix(k, "saga_latency_cpu_") || strings.HasPrefix(k, "saga_latency_wakeups_") ||
		k == "saga_latency_pg_round_trips_per_saga" || k == "saga_latency_pg_statements_per_saga" ||
		k == "saga_latency_messages_per_transaction"
}

// recordSagaCPU records in config the CPU per saga of a phase that ran
// sagas under cpuPrefix and its wake-ups per saga under wakePrefix (each
// bench_process, broker, postgres), and returns both triples in that
// order. It records too, under cpuPrefix "other" and "steal", the
// machine's busy CPU time that none of the three spent (other processes,
// the kernel's interrupts; the cluster's brokers with KAFKA_BROKERS) and
// the time the hypervisor stole, per saga: a phase that shared the CPUs
// with something else says so.
func (b *bench) recordSagaCPU(cpuPrefix, wakePrefix string, sagas int, u usage) (cpu, wakes [3]float64, other, steal float64) {
	perSaga := func(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond)/float64(sagas), 3) }
	for i, k := range []string{"bench_process", "broker", "postgres"} {
		cpu[i] = perSaga(u.cpu[i])
		wakes[i] = round(float64(u.wakes[i])/float64(sagas), 1)
		b.config[cpuPrefix+k], b.config[wakePrefix+k] = cpu[i], wakes[i]
	}
	if u.busy > 0 {
		other = perSaga(max(0, u.busy-u.cpu[0]-u.cpu[1]-u.cpu[2]))
		steal = perSaga(u.steal)
		b.config[cpuPrefix+"other"], b.config[cpuPrefix+"steal"] = other, steal
	}
	return cpu, wakes, other, steal
}

// sagaCPU returns the CPU per saga of the last throughput phase: bench
// process, broker, PostgreSQL.
func (b *bench) sagaCPU() [3]float64 {
	f := func(k string) float64 { v, _ := b.config[k].(float64); return v }
	return [3]float64{f("saga_cpu_ms_per_saga_bench_process"), f("saga_cpu_ms_per_saga_broker"), f("saga_cpu_ms_per_saga_postgres")}
}

// sagaRig is the orchestrator, three participants and a relay on one schema.
type sagaRig struct {
	pool   *pgxpool.Pool
	schema string
	o      *saga.Orchestrator
	def    *saga.Definition[sagaOrder]
	effect string
	// hops, in the latency phase only, records the hops of each round trip.
	hops *hopRecorder
	// batches counts the transactions of the relay, the participants and
	// the orchestrator, and the messages they carried.
	batches *batchMeter
	// wait: the middle step is a wait step, and whoever starts a saga then
	// signals its event (each in a transaction of its own, as a webhook
	// would); the wait phase only.
	wait bool
}

// sagaWaitEvent is the event the wait phase's middle step waits for.
const sagaWaitEvent = "stock.confirmed"

// sagaSignallers is how many signals each starter sends at once in the
// wait phase (webhooks arrive concurrently).
const sagaSignallers = 6

// signalStarted delivers the wait event to sagas ids, each in its own
// transaction, sagaSignallers at a time; nothing in the other phases.
func (r *sagaRig) signalStarted(ctx context.Context, ids []string) error {
	if !r.wait {
		return nil
	}
	var g errgroup.Group
	g.SetLimit(sagaSignallers)
	for _, id := range ids {
		g.Go(func() error { return saga.Signal(ctx, r.o, id, sagaWaitEvent, "", nil) })
	}
	return g.Wait()
}

// sagaPhase runs one rig. rate 0: start as fast as the rig completes (up
// to sagaMaxInFlight in flight) and return completed sagas per second (in
// quick mode: start sagaQuickCount at once and return them over the time
// from the first start to the last completion); rate > 0: start rate sagas
// a second and record the latency figures.
func (b *bench) sagaPhase(ctx context.Context, name string, rate int, hops bool) (float64, error) {
	conns := int32(20)
	if name == "wait" {
		conns += sagaStarters * sagaSignallers
	}
	trips := &pgtest.RoundTrips{Texts: true}
	pool, schema, done, err := b.workspaceCounting(ctx, conns, trips)
	if err != nil {
		return 0, err
	}
	defer done()
	rig := &sagaRig{pool: pool, schema: schema, effect: sqlident.Table(schema, "bench_saga_effect")}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+rig.effect+` (saga_id text NOT NULL, step text NOT NULL, PRIMARY KEY (saga_id, step))`); err != nil {
		return 0, err
	}
	topics := map[string]string{}
	for _, t := range []string{"credit", "stock", "ship", "reply"} {
		topics[t] = newTopic("saga_" + t)
	}
	dropTopics, err := b.createTopics(topics, sagaPartitions)
	if err != nil {
		return 0, err
	}
	defer dropTopics()
	rig.wait = name == "wait"
	steps := make([]saga.Step[sagaOrder], 0, 3)
	for _, s := range []string{"credit", "stock", "ship"} {
		if s == "stock" && rig.wait {
			steps = append(steps, saga.Step[sagaOrder]{Name: s, Kind: saga.Compensatable,
				Await: &saga.Await[sagaOrder]{Event: sagaWaitEvent, OnEvent: func(*sagaOrder, json.RawMessage) error { return nil },
					Timeout: time.Minute, OnTimeout: saga.TimeoutCompensate}})
			continue
		}
		steps = append(steps, saga.Step[sagaOrder]{Name: s, Kind: saga.Compensatable,
			Action: &saga.Command[sagaOrder]{Topic: topics[s]}, Compensation: &saga.Command[sagaOrder]{}})
	}
	rig.def, err = saga.Define(saga.Spec[sagaOrder]{Type: "bench-order", Version: 1, ReplyTopic: topics["reply"], Steps: steps})
	if err != nil {
		return 0, err
	}
	// The service, as a user builds it: millrace.New with its defaults (a
	// kafka.Publisher and a kafka.Subscriber on the brokers, in the
	// service's consumer group), the saga registered on its orchestrator,
	// a participant per step added to it. Only the instrumented hops
	// phase gives it a publisher and a subscriber of its own: the same
	// defaults, with a recorder around them.
	reg := prometheus.NewRegistry()
	rig.batches = newBatchMeter(reg)
	cfg := millrace.Config{Name: newTopic("saga_service"), Schema: schema, Brokers: b.brokers, Metrics: reg}
	if hops {
		rig.hops = newHopRecorder(topics["reply"])
		pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: b.brokers}, nil)
		if err != nil {
			return 0, err
		}
		defer pub.Close()
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{Brokers: b.brokers, ConsumerGroup: cfg.Name}, nil)
		if err != nil {
			return 0, err
		}
		defer sub.Close()
		cfg.Publisher, cfg.Subscriber = rig.hops.publisher(pub), rig.hops.subscriber(sub)
	}
	svc, err := millrace.New(pool, cfg)
	if err != nil {
		return 0, err
	}
	defer svc.Close()
	rig.o = svc.Orchestrator()
	if err := rig.o.Register(rig.def); err != nil {
		return 0, err
	}
	for _, s := range []string{"credit", "stock", "ship"} {
		if s == "stock" && rig.wait {
			continue
		}
		p, err := svc.AddParticipant(s, topics[s])
		if err != nil {
			return 0, err
		}
		step := s
		err = compensation.Register(p, step,
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, o sagaOrder) (struct{}, error) {
				_, err := tx.Exec(ctx, `INSERT INTO `+rig.effect+` (saga_id, step) VALUES ($1, $2)`, call.SagaID, step)
				return struct{}{}, err
			},
			func(ctx context.Context, tx pgx.Tx, call compensation.Call, o sagaOrder) error {
				_, err := tx.Exec(ctx, `DELETE FROM `+rig.effect+` WHERE saga_id = $1 AND step = $2`, call.SagaID, step)
				return err
			})
		if err != nil {
			return 0, err
		}
	}

	rctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() {
		if err := svc.Run(rctx); err != nil && rctx.Err() == nil {
			runErr = err
			stop()
		}
	})
	defer func() { stop(); wg.Wait() }()

	var result float64
	if rate == 0 {
		stmts, pgStat := readPgStatements(ctx, pool)
		profile := b.opts.sagaProfile != "" && name == "throughput"
		if profile {
			stop, err := startProfile(b.opts.sagaProfile)
			if err != nil {
				return 0, err
			}
			defer stop()
		}
		cpu := b.startCPU(ctx, pool)
		var total int
		if b.opts.quick {
			b.progress("sagas (%s): %d sagas to completion, %d partitions per topic", name, sagaQuickCount, sagaPartitions)
			result, total, err = rig.fixed(rctx, sagaQuickCount, sagaQuickDeadline)
		} else {
			b.progress("sagas (%s): %s, %d partitions per topic", name, b.opts.duration, sagaPartitions)
			result, total, err = rig.throughput(rctx, b.opts.duration)
		}
		stop()
		wg.Wait()
		used := cpu.stop()
		if profile {
			pprof.StopCPUProfile()
			b.progress("sagas: CPU profile of the throughput phase in %s (go tool pprof %s)", b.opts.sagaProfile, b.opts.sagaProfile)
		}
		if total > 0 {
			v, w, other, steal := b.recordSagaCPU("saga_cpu_ms_per_saga_", "saga_wakeups_per_saga_", total, used)
			b.progress("sagas: %d completed; CPU per saga: %.2f ms here, %.2f ms broker, %.2f ms PostgreSQL, %.2f ms anything else, %.2f ms stolen; wake-ups per saga: %.1f here, %.1f broker, %.1f PostgreSQL (processes that ended not counted)",
				total, v[0], v[1], v[2], other, steal, w[0], w[1], w[2])
			if after, ok := readPgStatements(ctx, pool); ok && pgStat {
				costMs, calls := pgCost(stmts, after, schema)
				var parts []string
				perGroup := map[string]float64{}
				for _, g := range reportedGroups() {
					if calls[g] == 0 {
						continue
					}
					perGroup[g] = round(costMs[g]/float64(total), 3)
					parts = append(parts, fmt.Sprintf("%s %.3f (%.1f calls)", g, costMs[g]/float64(total), float64(calls[g])/float64(total)))
				}
				b.config["saga_pg_exec_ms_per_saga"] = perGroup
				b.progress("sagas: PostgreSQL execution time per saga (pg_stat_statements), ms: %s", strings.Join(parts, ", "))
			}
		}
	} else {
		b.progress("sagas (%s): %s, %d partitions per topic", name, b.opts.duration, sagaPartitions)
		var p50, p99 time.Duration
		var sagas int
		if b.opts.latProfile != "" {
			stop, err := startProfile(b.opts.latProfile)
			if err != nil {
				return 0, err
			}
			b.opts.latProfile = "" // the first phase only
			defer stop()
		}
		cpu := b.startCPU(ctx, pool)
		trips0, texts0 := trips.N(), trips.Statements()
		batches0, berr := rig.batches.read()
		if berr != nil {
			return 0, berr
		}
		p50, p99, sagas, err = rig.latency(rctx, rate, b.opts.duration)
		b.results["saga_latency_p50_ms"], b.results["saga_latency_p99_ms"] = ms(p50), ms(p99)
		// Read while the phase's connections are open: every saga has
		// completed, and a backend that ends takes its wake-ups with it.
		used := cpu.stop()
		stop()
		wg.Wait()
		if err == nil && sagas > 0 {
			// At this rate a batch is a few messages: what a saga costs
			// here, against the throughput phase's figures, is what bounds
			// the latency on a machine this size.
			v, w, other, steal := b.recordSagaCPU("saga_latency_cpu_ms_per_saga_", "saga_latency_wakeups_per_saga_", sagas, used)
			rt := round(float64(trips.N()-trips0)/float64(sagas), 1)
			b.config["saga_latency_pg_round_trips_per_saga"] = rt
			stmts := statementsPerSaga(texts0, trips.Statements(), schema, sagas)
			b.config["saga_latency_pg_statements_per_saga"] = stmts
			b.progress("sagas (latency): CPU per saga at %d sagas/s: %.2f ms here, %.2f ms broker, %.2f ms PostgreSQL, %.2f ms anything else, %.2f ms stolen; wake-ups per saga: %.1f here, %.1f broker, %.1f PostgreSQL; %.1f round trips to PostgreSQL per saga, carrying %s",
				rate, v[0], v[1], v[2], other, steal, w[0], w[1], w[2], rt, statementsLine(stmts))
			batches1, berr := rig.batches.read()
			if berr != nil {
				return 0, berr
			}
			mean := meanBatches(batches0, batches1)
			b.config["saga_latency_messages_per_transaction"] = mean
			b.progress("sagas (latency): %s", batchesLine(mean))
			if hops {
				err = b.sagaHops(ctx, rig)
			}
		}
	}
	stop()
	wg.Wait()
	if err != nil {
		return 0, err
	}
	if runErr != nil {
		return 0, runErr
	}
	return result, nil
}

// startProfile starts a CPU profile of this process into path; stop ends
// it (more than once is fine) and closes the file.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// createTopics creates the topics with the given number of partitions and
// the broker's default replication (3 on the three-node cluster, as its
// other topics; 1 on the embedded broker), and returns a function that
// deletes them: a phase leaves no partitions behind for the next to share
// the cluster's CPU with.
func (b *bench) createTopics(topics map[string]string, partitions int32) (drop func(), err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...))
	if err != nil {
		return nil, err
	}
	adm := kadm.NewClient(cl)
	names := slices.Collect(maps.Values(topics))
	drop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := adm.DeleteTopics(ctx, names...); err != nil {
			b.progress("delete topics %v: %v", names, err)
		}
		cl.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := adm.CreateTopics(ctx, partitions, -1, nil, names...)
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		drop()
		return nil, fmt.Errorf("create topics %v: %w", names, err)
	}
	return drop, nil
}

// count returns the number of sagas in a status.
func (r *sagaRig) count(ctx context.Context, status saga.Status) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Table(r.schema, "saga_instance")+` WHERE status = $1`, status).Scan(&n)
	return n, err
}

// analyze gathers the planner's statistics of the rig's tables, as
// autovacuum does within a minute of a service's tables filling: the
// bench's schemas are seconds old, and a statement prepared on a table
// never analyzed can keep a plan made for an empty one (a sequential scan
// of a table that has grown). The phases call it once, after their
// warm-up.
func (r *sagaRig) analyze(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1`, r.schema)
	if err != nil {
		return err
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := r.pool.Exec(ctx, `ANALYZE `+sqlident.Table(r.schema, t)); err != nil {
			return fmt.Errorf("analyze %s: %w", t, err)
		}
	}
	return nil
}

// throughput starts sagas as fast as they complete, keeping at most
// sagaMaxInFlight live, and returns the completed sagas per second over
// the phase after a warm-up.
func (r *sagaRig) throughput(ctx context.Context, d time.Duration) (float64, int, error) {
	var started atomic.Int64
	var completed atomic.Int64 // as last read
	sctx, stopStarting := context.WithCancel(ctx)
	defer stopStarting()
	var wg sync.WaitGroup
	errs := make(chan error, sagaStarters)
	for w := range sagaStarters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * sagaStartBatch; sctx.Err() == nil; i += sagaStarters * sagaStartBatch {
				if started.Load()-completed.Load() >= sagaMaxInFlight {
					time.Sleep(time.Millisecond)
					continue
				}
				var ids []string
				err := pgx.BeginFunc(sctx, r.pool, func(tx pgx.Tx) error {
					ids = ids[:0]
					for j := i; j < i+sagaStartBatch; j++ {
						id := fmt.Sprintf("s-%d", j)
						if _, err := saga.StartTx(sctx, tx, r.o, r.def, id, sagaOrder{ID: id, Amount: j}); err != nil {
							return err
						}
						ids = append(ids, id)
					}
					return nil
				})
				if err == nil {
					err = r.signalStarted(sctx, ids)
				}
				if err != nil {
					if sctx.Err() == nil {
						errs <- err
					}
					return
				}
				started.Add(sagaStartBatch)
			}
		}()
	}
	read := func() (int, error) {
		n, err := r.count(ctx, saga.StatusCompleted)
		completed.Store(int64(n))
		return n, err
	}
	// Warm up for a fifth of the phase and until sagas complete, then
	// measure for the phase (longer if none completes in it, up to a minute).
	// The completed sagas are counted every sagaCountEvery: often enough
	// for the cap on sagas in flight, and the count's scan of saga_instance
	// is the bench's own load, counted in the phase's PostgreSQL CPU.
	var from int
	var t0 time.Time
	warm := time.Now().Add(d / 5)
	giveUp := time.Now().Add(time.Minute + d)
	for {
		select {
		case err := <-errs:
			return 0, 0, err
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(sagaCountEvery):
		}
		n, err := read()
		if err != nil {
			return 0, 0, err
		}
		if t0.IsZero() {
			if n > 0 && time.Now().After(warm) {
				if err := r.analyze(ctx); err != nil {
					return 0, 0, err
				}
				if n, err = read(); err != nil {
					return 0, 0, err
				}
				from, t0 = n, time.Now()
			}
		} else if time.Since(t0) >= d && n > from {
			break
		}
		if time.Now().After(giveUp) {
			return 0, 0, fmt.Errorf("%d sagas completed in a minute", n)
		}
	}
	n, err := read()
	if err != nil {
		return 0, 0, err
	}
	rate := float64(n-from) / time.Since(t0).Seconds()
	stopStarting()
	wg.Wait()
	n, err = read()
	return rate, n, err
}

// fixed starts n sagas at once (sagaStartBatch per transaction), waits up
// to deadline for every one to complete, and returns n over the time from
// the first start to the last completion (created_at to ended_at, both
// from this process's clock). A saga that does not complete in time, or
// ends otherwise, is an error: the figure comes from finished sagas only.
func (r *sagaRig) fixed(ctx context.Context, n int, deadline time.Duration) (float64, int, error) {
	for i := 0; i < n; i += sagaStartBatch {
		var ids []string
		err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
			ids = ids[:0]
			for j := i; j < min(n, i+sagaStartBatch); j++ {
				id := fmt.Sprintf("q-%d", j)
				if _, err := saga.StartTx(ctx, tx, r.o, r.def, id, sagaOrder{ID: id, Amount: j}); err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err == nil {
			err = r.signalStarted(ctx, ids)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	inst := sqlident.Table(r.schema, "saga_instance")
	giveUp := time.Now().Add(deadline)
	for {
		var completed, other int
		var span float64
		err := r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'completed'),
       count(*) FILTER (WHERE status <> 'completed' AND status <> 'running'),
       coalesce(extract(epoch FROM max(ended_at) - min(created_at)), 0)::float8
  FROM `+inst).Scan(&completed, &other, &span)
		if err != nil {
			return 0, 0, err
		}
		switch {
		case other > 0:
			return 0, 0, fmt.Errorf("%d of %d sagas ended other than completed", other, n)
		case completed == n:
			if span <= 0 {
				return 0, 0, fmt.Errorf("%d sagas completed in %gs", n, span)
			}
			return float64(n) / span, n, nil
		case time.Now().After(giveUp):
			return 0, 0, fmt.Errorf("only %d of %d sagas completed in %s", completed, n, deadline)
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// latency starts rate sagas a second for d and returns the p50 and p99 of
// start-to-completion (created_at to ended_at, both from this process's
// clock), waiting for the last ones to end.
func (r *sagaRig) latency(ctx context.Context, rate int, d time.Duration) (p50, p99 time.Duration, sagas int, err error) {
	interval := time.Second / time.Duration(rate)
	ids := make(chan string, 4*rate)
	var wg sync.WaitGroup
	errs := make(chan error, sagaStarters)
	for range sagaStarters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				if _, err := saga.Start(ctx, r.o, r.def, id, sagaOrder{ID: id}); err != nil {
					errs <- err
					return
				}
				if r.hops != nil {
					r.hops.start(id, time.Now())
				}
			}
		}()
	}
	// Warm up for a fifth of the phase (sagas "w-N", left out of the
	// figures), analyze the tables, then measure for the phase ("l-N").
	n, warmed := 0, 0
	tick := time.NewTicker(interval)
	warm := time.Now().Add(d / 5)
	var end time.Time
	for ctx.Err() == nil && (end.IsZero() || time.Now().Before(end)) {
		<-tick.C
		if end.IsZero() && time.Now().After(warm) {
			if err := r.analyze(ctx); err != nil {
				close(ids)
				wg.Wait()
				return 0, 0, 0, err
			}
			end = time.Now().Add(d)
		}
		if end.IsZero() {
			ids <- fmt.Sprintf("w-%d", warmed)
			warmed++
			continue
		}
		ids <- fmt.Sprintf("l-%d", n)
		n++
	}
	tick.Stop()
	close(ids)
	wg.Wait()
	select {
	case err := <-errs:
		return 0, 0, 0, err
	default:
	}
	inst := sqlident.Table(r.schema, "saga_instance")
	for wait := time.Now().Add(time.Minute); ; {
		c, err := r.count(ctx, saga.StatusCompleted)
		if err != nil {
			return 0, 0, 0, err
		}
		if c == n+warmed {
			break
		}
		if time.Now().After(wait) {
			return 0, 0, 0, fmt.Errorf("only %d of %d sagas completed a minute after the last start", c, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var s50, s99 float64
	err = r.pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - created_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM ended_at - created_at))
  FROM `+inst+` WHERE status = 'completed' AND id LIKE 'l-%'`).Scan(&s50, &s99)
	return time.Duration(s50 * float64(time.Second)), time.Duration(s99 * float64(time.Second)), n + warmed, err
}

// sagaHops reports the hops of the latency phase's round trips: p50 and
// p99 per hop over all steps as results (saga_hop_<hop>_p50_ms, _p99_ms),
// and per step in the progress lines.
func (b *bench) sagaHops(ctx context.Context, rig *sagaRig) error {
	steps := []string{"credit", "stock", "ship"}
	all, perStep, n, err := rig.hops.hops(ctx, rig, steps)
	if err != nil {
		return err
	}
	line := func(m map[string][]time.Duration, q float64) string {
		var out []string
		var sum time.Duration
		for _, h := range hopNames {
			if ds := m[h]; len(ds) > 0 {
				v := percentile(ds, q)
				sum += v
				out = append(out, fmt.Sprintf("%s %.1f", h, float64(v)/float64(time.Millisecond)))
			}
		}
		return strings.Join(out, ", ") + fmt.Sprintf(" (one step: %.1f)", float64(sum)/float64(time.Millisecond))
	}
	b.progress("sagas (latency): hops of %d sagas, ms, each hop's p50 over the 3 steps: %s", n, line(all, 0.5))
	b.progress("sagas (latency): each hop's p99 over the 3 steps: %s", line(all, 0.99))
	for _, s := range steps {
		b.progress("sagas (latency): step %s p50: %s", s, line(perStep[s], 0.5))
	}
	for _, h := range hopNames {
		b.results["saga_hop_"+h+"_p50_ms"] = ms(percentile(all[h], 0.5))
		b.results["saga_hop_"+h+"_p99_ms"] = ms(percentile(all[h], 0.99))
	}
	b.config["saga_hop_sagas"] = n
	return nil
}
