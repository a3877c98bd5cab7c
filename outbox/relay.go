package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/backoff"
	"github.com/millrace/millrace/internal/logging"
	"github.com/millrace/millrace/internal/pgprobe"
	"github.com/millrace/millrace/internal/sqlident"
)

// maxBatchSize is the largest RelayConfig.BatchSize: a batch is held in
// memory whole, and larger batches gain nothing (make bench: the drain rate
// is flat from 1,000 up).
const maxBatchSize = 10_000

// TopicsPublisher is a publisher that also sends the messages of several
// topics in one call (kafka.Publisher is one): the relay sends a batch
// that holds several topics in one PublishTopics call rather than in a
// Publish call per topic, one after the other; with Kafka, one round of
// acknowledgements rather than one per topic. Each topic's messages are
// in the batch's order. The error is read as Publish's: nil, a
// *core.BatchError naming the failed messages by UUID and topic (an event
// written to several topics is a message per topic with one UUID; a
// failure without its topic fails every copy, which the relay then sends
// again), or an error that fails the whole call (the relay then publishes
// the batch again a topic at a time, to find what is at fault).
type TopicsPublisher interface {
	message.Publisher
	PublishTopics(byTopic map[string][]*message.Message) error
}

// RelayConfig configures a Relay.
//
// Pool sizing: each worker holds one connection of the pool for the length
// of a batch (claim, publish, mark), and the LISTEN connection, opened
// through the pool, then leaves it for good (pgxpool's Hijack) and is
// reopened the same way when it breaks. So a relay uses up to Workers
// connections of the pool at once and one more outside it: give the pool
// MaxConns >= Workers plus what the rest of the process uses, and count
// Workers + 1 per relay against PostgreSQL's max_connections. When the
// process holds every connection of the pool, the relay's batches wait
// for one (and Run still returns promptly when its context ends).
type RelayConfig struct {
	// Schema holds millrace's tables. Defaults to "millrace".
	Schema string
	// Publisher receives the events. Required. Any Watermill publisher
	// works; millrace's kafka.Publisher sends each batch in one produce call
	// and says which messages failed. A publisher that returns a
	// *core.BatchError is told apart from one that fails a whole call;
	// for the latter the relay sends a failed call again one message at a
	// time to find the messages at fault, and stops after three failures
	// in a row (an outage). Errors marked core.Permanent dead-letter their
	// event at once; errors that say they are temporary (a Temporary()
	// bool method returning true, or a net.Error) charge no attempt (see
	// the package doc, "Failures"). A batch that holds several topics goes
	// out in one call to a TopicsPublisher (kafka.Publisher is one), else
	// in a Publish call per topic, one after the other.
	Publisher message.Publisher
	// BatchSize is the most events claimed and published at once; with
	// Workers it bounds the relay's memory (make bench: ~33 MiB peak RSS at
	// 1000, ~44 MiB at 2000, 64 MiB at 4000, draining a 200k backlog). At
	// most 10,000. Defaults to 2000.
	BatchSize int
	// Workers is the number of batches in flight at once in this relay,
	// each on its own lanes and its own pool connection, so that one batch
	// is published while another is claimed or marked. Defaults to 2.
	Workers int
	// PollInterval is how often the relay looks for events when it has no
	// hint of new ones. Defaults to 500ms. After finding work it looks
	// again at once, then one worker looks again sooner (from 4ms, doubling
	// up to PollInterval), so an event that no NOTIFY announced (a Writer
	// sends at most one per NotifyInterval) is not left waiting for the
	// next poll. The looks on these timers first ask whether anything is
	// claimable (one round trip, no transaction), and begin a batch only
	// when something is. A batch that was not full asks the same in its
	// COMMIT's round trip, and looks again at once only if something is.
	PollInterval time.Duration
	// PollOnly turns off LISTEN/NOTIFY: the relay only polls, and needs no
	// connection beyond the pool's. Use it behind a connection pooler in
	// transaction mode, where LISTEN does not work, and give the Writer a
	// negative NotifyInterval. Defaults to false.
	PollOnly bool
	// MaxAttempts is how many times an event failing with an error neither
	// permanent nor temporary is tried before it is dead-lettered. Defaults
	// to 10.
	MaxAttempts int
	// RetryMin and RetryMax bound the capped exponential backoff between
	// attempts of a failing event; an event that failed temporarily is
	// tried again after RetryMin. Default to 1s and 5m.
	RetryMin, RetryMax time.Duration
	// OutageBackoffMax caps the wait between tries while every publish
	// fails with a temporary error (the broker is down). Such failures count
	// no attempts: an outage must not dead-letter the backlog. Defaults to 10s.
	OutageBackoffMax time.Duration
	// SkipDeadLetteredKeys lets later events of a key flow past a
	// dead-lettered event of that key. Defaults to false: they wait, so
	// per-key order holds, until the dead letter is requeued or discarded.
	SkipDeadLetteredKeys bool
	// LanesPerBatch is the most lanes one batch takes. Lower it to spread
	// work over many relays more evenly. Defaults to Lanes/Workers.
	LanesPerBatch int
	// SyncCommit makes each batch's commit wait for its WAL flush. Defaults
	// to false: batches commit with synchronous_commit = off (for the
	// relay's own transactions only), which saves a disk flush per batch. A
	// database crash can then lose the marks of the last fraction of a
	// second, and those events are published again: a duplicate, never a
	// loss, which consumers deduplicate anyway.
	SyncCommit bool
	// Metrics, when set, registers the relay's Prometheus collector with it:
	// what it publishes, fails and dead-letters, its batch sizes, and the
	// backlog (pending events and the age of the oldest, read at scrape
	// time) and, for a CDCRelay, its slot; the package documentation lists
	// the series. Relays sharing a Registerer share the collector. Defaults
	// to nil: nothing counted.
	Metrics prometheus.Registerer
	// Logger receives the relay's logs. Defaults to DefaultLogger(): errors
	// (a failed batch, a lost LISTEN connection, a dead-lettered event) go
	// to slog.Default(), Info lines are logged at slog's Debug level. Set
	// watermill.NopLogger{} for silence.
	Logger watermill.LoggerAdapter
}

func (c *RelayConfig) setDefaults() {
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.Workers == 0 {
		c.Workers = 2
	}
	if c.PollInterval == 0 {
		c.PollInterval = 500 * time.Millisecond
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 10
	}
	if c.RetryMin == 0 {
		c.RetryMin = time.Second
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Minute
	}
	if c.OutageBackoffMax == 0 {
		c.OutageBackoffMax = 10 * time.Second
	}
	if c.LanesPerBatch == 0 {
		c.LanesPerBatch = max(1, Lanes/c.Workers)
	}
	if c.Logger == nil {
		c.Logger = DefaultLogger()
	}
}

// DefaultLogger is the logger of the outbox's long-running parts (Relay,
// CDCRelay) when their config sets none: Watermill's slog adapter over
// slog.Default() as it is when called, with Watermill's Info level mapped
// to slog's Debug, so that by default errors are printed and routine lines
// are not.
// Every millrace part without a Logger of its own uses the same.
func DefaultLogger() watermill.LoggerAdapter { return logging.Default() }

func (c *RelayConfig) validate() error {
	switch {
	case c.Publisher == nil:
		return configError("RelayConfig.Publisher is required")
	case c.BatchSize < 1 || c.BatchSize > maxBatchSize:
		return configError("RelayConfig.BatchSize must be in 1..%d, got %d", maxBatchSize, c.BatchSize)
	case c.Workers < 1:
		return configError("RelayConfig.Workers must be positive, got %d", c.Workers)
	case c.PollInterval < 0 || c.RetryMin < 0 || c.RetryMax < c.RetryMin || c.OutageBackoffMax < 0:
		return configError("RelayConfig.PollInterval, RetryMin, RetryMax and OutageBackoffMax must not be negative, and RetryMax must be >= RetryMin")
	case c.MaxAttempts < 1:
		return configError("RelayConfig.MaxAttempts must be positive, got %d", c.MaxAttempts)
	case c.LanesPerBatch < 1 || c.LanesPerBatch > Lanes:
		return configError("RelayConfig.LanesPerBatch must be in 1..%d, got %d", Lanes, c.LanesPerBatch)
	}
	return nil
}

// Relay ships events from the outbox to a Watermill publisher. Run any
// number of relays, in one process or many: each batch locks the lanes it
// works on (SELECT ... FOR NO KEY UPDATE SKIP LOCKED on outbox_lane) for as
// long as it takes to claim, publish and mark it, so a key's events are in
// flight from one relay at a time and leave in id order: events of one topic
// and partition key are published in commit order (order is per topic and
// key; one Publish call per topic, or one PublishTopics call for the
// batch, as Kafka orders per topic partition only). Claims go by state
// (what is in outbox_pending), never by a cursor, so a transaction that
// commits late with a lower id is still published.
//
// Delivery is at least once: a relay that dies after publishing and before
// its mark commits leaves the batch pending, and it is published again.
type Relay struct {
	cfg     RelayConfig
	pool    *pgxpool.Pool
	log     watermill.LoggerAdapter
	metrics *metrics // nil: none

	schema string

	sql     relaySQL
	channel string
	// cdcHalf: the polling half of a CDCRelay, which claims only what is
	// handed to the pending set (see claimable).
	cdcHalf bool

	wake chan struct{}
	// held are the lanes whose events each worker's batch has claimed, by
	// worker, from the claim until the batch's question for more work goes
	// out (see commit): a worker does not look for events in its siblings'
	// lanes.
	heldMu sync.Mutex
	held   [][]int16
	// trail asks worker 0, the only one that looks again on a short timer
	// after work (see work), to start its short looks again: another
	// worker found work.
	trail chan struct{}
}

// NewRelay returns a Relay. It does not touch the database or the broker
// until Run.
func NewRelay(pool *pgxpool.Pool, cfg RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, configError("NewRelay needs a pool")
	}
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, configError("RelayConfig.Schema: %w", err)
	}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:     cfg,
		pool:    pool,
		schema:  schema,
		log:     cfg.Logger.With(watermill.LogFields{"component": "outbox.Relay", "schema": schema}),
		channel: notifyChannel(schema),
		wake:    make(chan struct{}, 1),
		trail:   make(chan struct{}, 1),
		held:    make([][]int16, cfg.Workers),
		sql:     newRelaySQL(schema, cfg.SyncCommit, false),
	}
	if cfg.Metrics != nil {
		admin, err := NewAdmin(pool, AdminConfig{Schema: schema})
		if err == nil {
			r.metrics, err = registerMetrics(cfg.Metrics, admin)
		}
		if err != nil {
			return nil, configError("RelayConfig.Metrics: %w", err)
		}
	}
	return r, nil
}

// Run ships events until ctx ends, then finishes the batches in flight and
// returns nil. It returns promptly when ctx ends, also while it waits for a
// connection of an exhausted pool: only a claimed batch outlives ctx.
//
// At start it probes the outbox tables with the statements it will run (in
// a transaction it rolls back) and returns an error wrapping the database's
// at once if they are missing (not migrated, wrong Schema) or the role
// lacks a privilege on them. Other database and broker failures, then and
// later, are logged and retried.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.probe(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	if !r.cfg.PollOnly {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(ctx) }()
	}
	for i := range r.cfg.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); r.work(ctx, i) }()
	}
	wg.Wait()
	return nil
}

// probe runs the relay's statements on no rows, in a transaction it rolls
// back (internal/pgprobe): it returns an error only for a missing object
// or privilege (SQLSTATE classes 42 and 3F); other failures (the database
// is not up yet) are logged and retried until ctx ends.
func (r *Relay) probe(ctx context.Context) error {
	err := pgprobe.Probe(ctx, r.pool, r.cfg.OutageBackoffMax, func(err error, wait time.Duration) {
		r.log.Error("Relay cannot reach the database at start; retrying", err, watermill.LogFields{"retry_in": wait.String()})
	}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, r.sql.lockLanes, 0, 0, 0, false); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, r.sql.lockWindow, 0, 0); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, r.sql.claim, []int16{}, 0, false); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, r.sql.claimNoted, 0, false); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, r.sql.unclaim, []int64{}, []bool{}, []bool{}, []*time.Time{}, []*string{}, []bool{}); err != nil {
			return err
		}
		if r.cdcHalf {
			return nil
		}
		return r.checkNoCDC(ctx, tx)
	})
	if errors.Is(err, core.ErrConfig) {
		return err
	}
	if err != nil {
		return fmt.Errorf("outbox: relay cannot use the outbox tables in schema %q (migrations applied? privileges granted?): %w", r.schema, err)
	}
	return nil
}

// checkNoCDC refuses a schema set up for change data capture (a
// publication on outbox_event): there the CDC relay's stream publishes
// the events a polling Writer writes, in commit order with the others, and
// a polling Relay beside it would publish them too, out of that order.
func (r *Relay) checkNoCDC(ctx context.Context, tx pgx.Tx) error {
	var pub string
	err := tx.QueryRow(ctx, `SELECT pubname::text FROM pg_publication_tables WHERE schemaname = $1 AND tablename = 'outbox_event' LIMIT 1`, r.schema).Scan(&pub)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	return pgprobe.Refused(fmt.Errorf("outbox: schema %q is set up for change data capture (publication %q on outbox_event): run a CDCRelay there, not a polling Relay (it would publish the polling Writers' events out of order with the stream), or DropCDC first (%w)", r.schema, pub, core.ErrConfig))
}

// errOutage is returned by a batch when every publish failed with a
// temporary error: the broker (or the database) is unavailable.
var errOutage = errors.New("outbox: publish unavailable")

// trailStart is the first of the short looks for events after work was
// found (see work): a few of a Writer's default NotifyInterval (1ms), so
// that an event written in the interval after an announced one, and so
// not announced itself, waits for no longer than that; a look at 1ms,
// then 2, mostly found nothing (measured with the 2ms interval of the
// time), since events that come faster than one per NotifyInterval bring
// a NOTIFY of their own within it.
const trailStart = 4 * time.Millisecond

// look is how a batch finds the lanes it works on (takeBatch).
type look int

const (
	// lookForWork locks the lanes of the first claimable events (and only
	// those: a lane lock writes WAL) and claims in them, in one round
	// trip: the batch after a NOTIFY, after a batch whose question found
	// more work, and while the worker goes round the ring of windows.
	lookForWork look = iota
	// askFirst is a look on a timer, that nothing announced: it asks
	// first, outside a transaction, whether anything is claimable, and
	// looks for work only when something is. Under a trickle of events
	// most such looks find nothing, and a look that finds nothing costs
	// two round trips (BEGIN with the look, then ROLLBACK); the question
	// costs one.
	askFirst
	// drainWindow is the batch after a full one: a backlog drains, and
	// the look for work would only find the lanes of its head held by the
	// other batches. It locks a window of lanes at once and claims in
	// them, so that a backlog goes out in parallel.
	drainWindow
)

// worker is the state of one of a relay's work loops.
type worker struct {
	id int
	// offset is the first lane of the next batch's window; the window
	// moves on after every batch.
	offset int
	look   look
	// outages counts the batches failed in a row; empty the windows
	// found empty in a row: the worker sleeps only after a whole ring of
	// them, so every lane is looked at on every wake-up.
	outages, empty int
	// idle is how long the next sleep lasts without a NOTIFY: after work
	// was found, from trailStart, doubling up to PollInterval.
	idle time.Duration
	// trail is r.trail for worker 0, nil (never ready) for the others.
	trail <-chan struct{}
}

// work is one of a relay's work loops: a batch (runBatch), then, by what
// it found, another batch at once, a back-off after an outage, or a sleep
// until a NOTIFY or a timer says there may be work.
//
// After work is found, events may follow that no NOTIFY announces (a
// Writer sends at most one per NotifyInterval): they are looked for again
// on a short timer, from trailStart and doubling. Worker 0 alone does
// that, also after another worker's batch: each look that finds nothing is
// a round trip, and with every worker looking, a trickle of events cost
// the database more in looks than in events. The others sleep until a
// NOTIFY or PollInterval.
func (r *Relay) work(ctx context.Context, id int) {
	w := &worker{id: id, offset: rand.IntN(Lanes), idle: r.cfg.PollInterval}
	if id == 0 {
		w.trail = r.trail
	}
	windowsPerRing := (Lanes + r.cfg.LanesPerBatch - 1) / r.cfg.LanesPerBatch
	for ctx.Err() == nil {
		n, more, err := r.runBatch(ctx, w.id, w.offset, w.look)
		w.offset = (w.offset + r.cfg.LanesPerBatch) % Lanes
		w.look = lookForWork
		if n >= r.cfg.BatchSize {
			w.look = drainWindow
		}
		switch {
		case errors.Is(err, errNothingPending):
			// No free lane has work: the other windows have none either.
			w.outages = 0
			r.sleep(ctx, w)
		case err != nil:
			r.backOff(ctx, w, err)
		case n > 0:
			w.outages, w.empty = 0, 0
			r.foundWork(w)
			if !more {
				// Nothing claimable after the batch: wait for a NOTIFY
				// or the short looks.
				r.sleep(ctx, w)
			}
		default:
			w.outages = 0
			if w.empty++; w.empty >= windowsPerRing {
				r.sleep(ctx, w)
			}
		}
	}
}

// backOff waits after a failed batch, longer after each failure in a row.
func (r *Relay) backOff(ctx context.Context, w *worker, err error) {
	w.outages++
	w.empty = 0
	wait := backoff.Exponential(w.outages, 50*time.Millisecond, r.cfg.OutageBackoffMax)
	r.log.Error("Relay batch failed; retrying", err, watermill.LogFields{"worker": w.id, "retry_in": wait.String()})
	r.metrics.outage()
	backoff.Sleep(ctx, wait)
}

// foundWork starts the short looks after work (see work): worker 0's own,
// or, for another worker, worker 0's.
func (r *Relay) foundWork(w *worker) {
	if w.trail != nil {
		w.idle = trailStart
		return
	}
	w.idle = r.cfg.PollInterval
	select {
	case r.trail <- struct{}{}:
	default:
	}
}

// sleep waits until a NOTIFY, the end of w.idle (then the next batch asks
// first: nothing announced work), or ctx's end. Worker 0 starts its short
// looks again when another worker found work.
func (r *Relay) sleep(ctx context.Context, w *worker) {
	w.empty = 0
	t := time.NewTimer(w.idle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
		case <-r.wake:
			w.look = lookForWork
		case <-w.trail:
			// Another worker's batch found work and looked again at
			// once: the short looks start over.
			w.idle = trailStart
			t.Reset(w.idle)
			continue
		case <-t.C:
			w.look = askFirst
		}
		w.idle = min(w.idle*2, r.cfg.PollInterval)
		return
	}
}

// listen turns NOTIFY hints into wake-ups on a connection of its own,
// reconnecting with backoff when it breaks. The backoff starts again after
// a connection that reached LISTEN: it grows only while reconnects fail.
func (r *Relay) listen(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		listening, err := r.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if listening {
			failures = 0
		}
		failures++
		wait := backoff.Exponential(failures, 100*time.Millisecond, 10*time.Second)
		r.log.Error("Relay LISTEN connection lost; polling until it is back", err, watermill.LogFields{"retry_in": wait.String()})
		backoff.Sleep(ctx, wait)
	}
}

// listenOnce listens on one connection until it fails, and reports whether
// it got as far as LISTEN.
func (r *Relay) listenOnce(ctx context.Context) (listening bool, err error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	// The connection leaves the pool for good: it is in LISTEN state.
	pc := conn.Hijack()
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+sqlident.Quote(r.channel)); err != nil {
		return false, err
	}
	r.signal() // catch up on anything written before LISTEN took effect
	for {
		if _, err := pc.WaitForNotification(ctx); err != nil {
			return true, err
		}
		r.signal()
	}
}

func (r *Relay) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

type pendingRow struct {
	id                                  int64
	lane                                int16 // read from the stream only (CDCRelay)
	eventID, topic, key, aggType, aggID string
	eventType                           string
	payload, payloadBytes, headers      []byte
	attempts                            int
	// Its pending state before the claim, restored if it goes back
	// unpublished.
	blocked       bool
	nextAttemptAt *time.Time
}

// runBatch claims, publishes and marks one batch in one transaction, and
// returns how many events it handled. Until the batch is claimed, ctx
// bounds every step (the pool's acquire, the begin, the lane locks, the
// claim), so a stopping relay never waits for a connection. Once claimed,
// the batch outlives ctx: it is published and marked even while Run is
// stopping, so a graceful stop adds no duplicates.
//
// more says whether to look again at once: after a full batch, yes; after
// one that was not full, whether anything was claimable once it committed,
// outside the lanes its siblings hold (asked in the COMMIT's round trip;
// yes when the question failed; see commit).
func (r *Relay) runBatch(ctx context.Context, worker, offset int, how look) (n int, more bool, err error) {
	if ctx.Err() != nil {
		return 0, false, nil
	}
	// The batch's transaction runs on the connection itself, not in a
	// pgx.Tx: its BEGIN goes out in the round trip of the lane locks.
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return 0, false, stopping(ctx, fmt.Errorf("outbox: begin: %w", err))
	}
	// Release destroys a connection still in a transaction (its rollback
	// failed): it never goes back to the pool with locks held.
	defer conn.Release()
	tx := conn.Conn()
	defer rollbackOpen(ctx, tx)

	lanes, rows, err := r.takeBatch(ctx, tx, worker, offset, how)
	if errors.Is(err, errNothingPending) {
		return 0, false, err
	}
	if err != nil || len(rows) == 0 {
		return 0, false, stopping(ctx, err)
	}
	// From here the worker looks again after the batch, whatever becomes
	// of it (its question, a full batch, or a retry after an outage): its
	// siblings may leave the events of its lanes to it (see commit).
	r.hold(worker, lanes)
	defer r.hold(worker, nil)
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()

	endSpan := traceBatch(ctx, rows) // tracing.go
	failed, outage := r.publish(rows)
	endSpan(len(failed), outage)
	if allUncharged(rows, failed) {
		// Nothing went out and nothing says the events are at fault: the
		// broker is unavailable. Roll back (the events stay pending),
		// count no attempts, back off.
		var first error
		for _, err := range failed {
			first = err
			break
		}
		return 0, false, fmt.Errorf("%w: %d events: %v", errOutage, len(rows), first)
	}
	var back unclaimed
	if len(failed) > 0 {
		back = r.settleFailures(rows, failed)
		if _, err := tx.Exec(bctx, r.sql.unclaim, back.ids, back.blocked, back.dead, back.nextAt, back.errs, back.charge); err != nil {
			return 0, false, fmt.Errorf("outbox: return %d failed events to the pending set: %w", len(back.ids), err)
		}
	}
	more, err = r.commit(bctx, tx, worker, len(rows) < r.cfg.BatchSize)
	if err != nil {
		return 0, false, fmt.Errorf("outbox: commit batch of %d: %w", len(rows), err)
	}
	r.metrics.batch(len(rows)-len(back.ids), back)
	if outage != nil {
		// What went out is marked; the rest waits, uncharged, while the
		// worker backs off.
		return len(rows), false, fmt.Errorf("%w: %d of %d events not sent: %v", errOutage, len(back.ids), len(rows), outage)
	}
	return len(rows), more, nil
}

// rollbackOpen rolls back the transaction open on tx, if any (one
// committed, or never begun, is left as it is). A failed rollback closes
// the connection, which its pool then destroys.
func rollbackOpen(ctx context.Context, tx *pgx.Conn) {
	if tx.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	tx.Exec(rctx, "ROLLBACK") //nolint:errcheck // a failure closes the connection
}

// commit commits the batch's transaction on tx. If ask, it asks in the
// same round trip, after the COMMIT and outside the transaction, for the
// lanes of what is claimable (claimableLanes), and returns whether to look
// (worthALook); a failed question (the COMMIT went through) answers yes,
// so that the worker looks rather than sleeps. Without ask it answers yes.
//
// The worker's lanes leave held before the question goes out: a sibling
// that, once its own answer is back, still sees a lane held knows that the
// holder has not asked yet, and that the holder's question will see what
// the sibling's saw in that lane.
func (r *Relay) commit(ctx context.Context, tx *pgx.Conn, worker int, ask bool) (more bool, err error) {
	r.hold(worker, nil)
	if !ask {
		_, err := tx.Exec(ctx, "COMMIT")
		return true, err
	}
	// A wake-up signalled before the question is answered by it: taken
	// here, it would only start a look that finds nothing. Events
	// committed after the question bring a NOTIFY of their own, or are
	// found by worker 0's short looks.
	select {
	case <-r.wake:
	default:
	}
	b := &pgx.Batch{}
	b.Queue("COMMIT")
	b.Queue(r.sql.claimableLanes, !r.cfg.SkipDeadLetteredKeys, questionLanes)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return false, err
	}
	var lanes []int16
	if err := br.QueryRow().Scan(&lanes); err != nil {
		r.log.Error("Relay could not ask for more work after a batch; looking again", err, nil)
		return true, nil
	}
	return r.worthALook(worker, lanes), nil
}

// questionLanes is how many of the first claimable events' lanes a
// question for work asks for (claimableLanes).
const questionLanes = 16

// worthALook says whether worker should look for work, given the answer
// to its question (claimableLanes): yes when a lane in it is free, or when
// there may be more behind the events it names; no when there is nothing,
// or when every lane in it is held by a sibling's batch.
//
// An event in a lane a sibling holds is not this worker's to claim until
// the sibling commits, and a look for it found the lane locked and rolled
// back: two round trips for nothing, about a third of the looks after a
// batch at 200 sagas/s in make bench (saga group). The sibling still holds
// the lane after this answer came back, so it has not sent its own
// question yet (commit), and that question will see the event: nothing is
// left behind.
func (r *Relay) worthALook(worker int, lanes []int16) bool {
	if len(lanes) == 0 {
		return false
	}
	if len(lanes) >= questionLanes {
		return true
	}
	r.heldMu.Lock()
	defer r.heldMu.Unlock()
	free := func(l int16) bool {
		for w, held := range r.held {
			if w != worker && slices.Contains(held, l) {
				return false
			}
		}
		return true
	}
	return slices.ContainsFunc(lanes, free)
}

// stopping returns err, or nil when ctx has ended: a step cut short by the
// relay stopping is no failure to log and back off from (its transaction
// rolls back, nothing was in flight).
func stopping(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// unclaimed are the events of a batch that go back to the pending set, as
// columns for the unclaim statement.
type unclaimed struct {
	ids           []int64
	blocked, dead []bool
	nextAt        []*time.Time
	errs          []*string // nil: held behind its key or not tried
	charge        []bool
	charged, died int
}

// settleFailures decides what becomes of the events that did not go out.
// The first failure of a key counts (a key of a topic: as a publisher
// holds a key back within a call, and a call is of one topic, or per topic
// with PublishTopics; the pending set then holds the key's later events in
// every topic while the failed one is blocked):
//
//   - permanent (isPermanent): dead-lettered at once, one attempt
//     charged, with its reason;
//   - temporary (isTemporary: the broker or a partition is away): no attempt
//     charged; the event waits RetryMin, blocking its key, with its reason;
//   - anything else: an attempt charged; retried with backoff, dead-lettered
//     after MaxAttempts.
//
// The key's later events in the batch were held behind it and return as
// they were, as do events a publisher never tried (errNotTried). A later
// event of a failed key that did go out overtook it: the publisher broke
// its promise (core.BatchError), which is logged as an error.
func (r *Relay) settleFailures(rows []pendingRow, failed map[int64]error) unclaimed {
	var u unclaimed
	now := time.Now()
	failedKeys := map[string]bool{} // topic, NUL, key
	for _, row := range rows {
		err, bad := failed[row.id]
		key := row.topic + "\x00" + row.key
		if failedKeys[key] {
			if bad {
				u.add(row.id, row.blocked, false, row.nextAttemptAt, nil, false)
			} else {
				r.log.Error("Outbox event published ahead of a failed event of its key", nil, watermill.LogFields{"event_id": row.eventID, "topic": row.topic, "partition_key": row.key})
			}
			continue
		}
		if !bad {
			continue
		}
		failedKeys[key] = true
		if errors.Is(err, errNotTried) {
			u.add(row.id, row.blocked, false, row.nextAttemptAt, nil, false)
			continue
		}
		reason := err.Error()
		fields := watermill.LogFields{"event_id": row.eventID, "topic": row.topic, "partition_key": row.key}
		switch {
		case isPermanent(err):
			fields["attempt"] = row.attempts + 1
			u.add(row.id, true, true, &now, &reason, true)
			u.charged++
			u.died++
			r.log.Error("Outbox event dead-lettered: the publisher says it cannot succeed", err, fields)
		case isTemporary(err):
			next := now.Add(backoff.Exponential(1, r.cfg.RetryMin, r.cfg.RetryMax))
			u.add(row.id, true, false, &next, &reason, false)
			r.log.Info("Outbox event failed temporarily; will retry, no attempt charged: "+reason, fields)
		default:
			attempt := row.attempts + 1
			fields["attempt"] = attempt
			dead := attempt >= r.cfg.MaxAttempts
			next := now.Add(backoff.Exponential(attempt, r.cfg.RetryMin, r.cfg.RetryMax))
			u.add(row.id, true, dead, &next, &reason, true)
			u.charged++
			if dead {
				u.died++
				r.log.Error("Outbox event dead-lettered", err, fields)
			} else {
				r.log.Info("Outbox event failed; will retry: "+reason, fields)
			}
		}
	}
	return u
}

func (u *unclaimed) add(id int64, blocked, dead bool, nextAt *time.Time, err *string, charge bool) {
	u.ids = append(u.ids, id)
	u.blocked = append(u.blocked, blocked)
	u.dead = append(u.dead, dead)
	u.nextAt = append(u.nextAt, nextAt)
	u.errs = append(u.errs, err)
	u.charge = append(u.charge, charge)
}

// takeBatch locks the lanes of a batch (see lockLanes) and claims their
// events: it locks those lanes with something to claim, or, when other
// batches hold those of a backlog's head, a window of the others. It
// returns errNothingPending when there is nothing to claim in a lane no
// other batch holds. While the worker drains a backlog (its last batch was
// full) it locks a window at once: the look for work would only find
// every lane busy, and cost the drain a second walk of the pending set's
// head per batch.
//
// An askFirst batch (nothing announced work) first asks whether
// anything is claimable, outside the transaction, and returns
// errNothingPending at once when nothing is, or nothing but events in
// lanes its siblings hold (worthALook).
//
// It begins the transaction on tx, a connection out of one. BEGIN goes out
// with the first lock; the look for work (lockLanes) takes its claim with
// it too (claimNoted), so a batch that finds work makes one round trip
// where it made three. A window's claim takes its lanes as a parameter,
// in a round trip of its own.
func (r *Relay) takeBatch(ctx context.Context, tx *pgx.Conn, worker, offset int, how look) ([]int16, []pendingRow, error) {
	hold := !r.cfg.SkipDeadLetteredKeys
	if how == askFirst {
		var lanes []int16
		if err := tx.QueryRow(ctx, r.sql.claimableLanes, hold, questionLanes).Scan(&lanes); err != nil {
			return nil, nil, fmt.Errorf("outbox: look for work: %w", err)
		}
		if !r.worthALook(worker, lanes) {
			return nil, nil, errNothingPending
		}
	}
	if how != drainWindow {
		// The look for work and the claim in the lanes it locked.
		b := r.batch(true)
		b.Queue(r.sql.lockLanes, offset, r.cfg.LanesPerBatch, r.cfg.BatchSize, hold)
		b.Queue(r.sql.claimNoted, r.cfg.BatchSize, hold)
		br := tx.SendBatch(ctx, b)
		got, rows, err := r.readLockAndClaim(br, true, true)
		if err != nil {
			return nil, nil, fmt.Errorf("outbox: %w", err)
		}
		if len(got) == 0 {
			return nil, nil, errNothingPending
		}
		if got[0] != nil {
			return lanesOf(got), rows, nil
		}
		// Work whose lanes other batches hold: the claim behind the look
		// had no lane, and claimed nothing.
	}
	draining := how == drainWindow
	b := r.batch(draining) // begun by the look above unless draining
	b.Queue(r.sql.lockWindow, offset, r.cfg.LanesPerBatch)
	got, _, err := r.readLockAndClaim(tx.SendBatch(ctx, b), draining, false)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: %w", err)
	}
	lanes := lanesOf(got)
	qrows, _ := tx.Query(ctx, r.sql.claim, lanes, r.cfg.BatchSize, hold)
	rows, err := scanClaimed(qrows)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return lanes, rows, nil
}

// hold records the lanes of worker's batch (nil: none).
func (r *Relay) hold(worker int, lanes []int16) {
	r.heldMu.Lock()
	r.held[worker] = lanes
	r.heldMu.Unlock()
}

// batch is a new batch; if begin, it begins the transaction: BEGIN (and
// the relay's SET LOCAL) ahead of what is queued next.
func (r *Relay) batch(begin bool) *pgx.Batch {
	b := &pgx.Batch{}
	if begin {
		for _, s := range r.sql.beginStatements {
			b.Queue(s)
		}
	}
	return b
}

// readLockAndClaim reads a batch of batch's begin statements (if begun), a
// lane lock and, withClaim, the claim behind it, and closes it: the lanes
// the lock returned and the rows claimed.
func (r *Relay) readLockAndClaim(br pgx.BatchResults, begun, withClaim bool) ([]*int16, []pendingRow, error) {
	defer br.Close()
	if begun {
		for range r.sql.beginStatements {
			if _, err := br.Exec(); err != nil {
				return nil, nil, fmt.Errorf("begin: %w", err)
			}
		}
	}
	rows, _ := br.Query()
	got, err := pgx.CollectRows(rows, pgx.RowTo[*int16])
	if err != nil {
		return nil, nil, fmt.Errorf("lock lanes: %w", err)
	}
	var claimed []pendingRow
	if withClaim {
		rows, _ := br.Query()
		if claimed, err = scanClaimed(rows); err != nil {
			return nil, nil, fmt.Errorf("claim: %w", err)
		}
	}
	return got, claimed, br.Close()
}

func lanesOf(got []*int16) []int16 {
	lanes := make([]int16, 0, len(got))
	for _, l := range got {
		if l != nil {
			lanes = append(lanes, *l)
		}
	}
	return lanes
}

// errNothingPending says that no free lane has an event to claim: the
// worker need not look at its other windows before it waits.
var errNothingPending = errors.New("outbox: nothing to claim")

// scanClaimed reads the claim's rows, in id order.
func scanClaimed(rows pgx.Rows) ([]pendingRow, error) {
	defer rows.Close()
	// Grown as rows arrive: most polls claim few rows or none, and
	// reserving BatchSize rows for each would cost ~200 bytes a row.
	var out []pendingRow
	for rows.Next() {
		var p pendingRow
		if err := rows.Scan(&p.id, &p.eventID, &p.topic, &p.key, &p.aggType, &p.aggID, &p.eventType,
			&p.payload, &p.payloadBytes, &p.headers, &p.attempts, &p.blocked, &p.nextAttemptAt); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Publish in id order: the order the events were written in.
	slices.SortFunc(out, func(a, b pendingRow) int { return cmp.Compare(a.id, b.id) })
	return out, nil
}

// message builds the Watermill message of a pending row: the event id is
// the message UUID, and the row's headers plus millrace's metadata keys are
// its metadata.
func (p *pendingRow) message() *message.Message {
	payload, contentType := p.payload, core.ContentTypeJSON
	if p.payloadBytes != nil {
		payload, contentType = p.payloadBytes, core.ContentTypeBinary
	}
	msg := message.NewMessage(p.eventID, payload)
	if md := p.metadata(); md != nil {
		msg.Metadata = md
	}
	msg.Metadata.Set(core.MetadataEventID, p.eventID)
	msg.Metadata.Set(core.MetadataPartitionKey, p.key)
	if msg.Metadata.Get(core.MetadataContentType) == "" {
		// A content type of the writer's own travels as it was written.
		msg.Metadata.Set(core.MetadataContentType, contentType)
	}
	if p.eventType != "" {
		msg.Metadata.Set(core.MetadataEventType, p.eventType)
	}
	if p.aggType != "" {
		msg.Metadata.Set(core.MetadataAggregateType, p.aggType)
	}
	if p.aggID != "" {
		msg.Metadata.Set(core.MetadataAggregateID, p.aggID)
	}
	return msg
}

// metadata decodes the row's headers: nil for none ("{}", the common case,
// is not decoded) or for a column that is not a JSON object of strings.
func (p *pendingRow) metadata() map[string]string {
	if len(p.headers) <= 2 {
		return nil
	}
	if md, ok := decodeHeaders(p.headers); ok {
		return md
	}
	var md map[string]string
	if json.Unmarshal(p.headers, &md) != nil {
		return nil
	}
	return md
}

// publish sends rows, in one PublishTopics call to a TopicsPublisher, else
// in one Publish call per topic, each topic's in id order (a batch that
// interleaves topics still goes out in a few calls; Kafka orders per topic
// and partition only), and returns the failures by row id. outage
// is set when a publisher that fails whole calls is unavailable: the
// one-at-a-time fallback stopped at a failure that is not permanent, and
// the rows it did not try are failed with errNotTried.
func (r *Relay) publish(rows []pendingRow) (failed map[int64]error, outage error) {
	failed = map[int64]error{}
	if sameTopic(rows) {
		return failed, r.publishRun(rows, failed)
	}
	if tp, ok := r.cfg.Publisher.(TopicsPublisher); ok {
		byTopic := map[string][]*message.Message{}
		for i := range rows {
			byTopic[rows[i].topic] = append(byTopic[rows[i].topic], rows[i].message())
		}
		err := tp.PublishTopics(byTopic)
		if err == nil || r.batchFailures(rows, err, failed) {
			return failed, nil
		}
		// The call failed whole: find what is at fault one topic at a
		// time, as with a publisher without PublishTopics.
	}
	var topics []string
	byTopic := map[string][]pendingRow{}
	for _, row := range rows {
		if _, seen := byTopic[row.topic]; !seen {
			topics = append(topics, row.topic)
		}
		byTopic[row.topic] = append(byTopic[row.topic], row)
	}
	for _, topic := range topics {
		if outage != nil {
			for _, row := range byTopic[topic] {
				failed[row.id] = errNotTried
			}
			continue
		}
		outage = r.publishRun(byTopic[topic], failed)
	}
	return failed, outage
}

// batchFailures records in failed what a publisher's *core.BatchError
// err says of rows, the messages of its call, and reports whether err was
// one. A message is a copy of an event on one topic: the same event id may
// go to several topics (a fan-out), and a failure names its copy by UUID
// and topic (core.MessageError.Topic); one without a topic, of an id the
// call sent to several topics, fails every copy of it (a duplicate, never
// a loss). A BatchError that names a message the call did not hold, or
// none, or one with no error, fails every row: its report cannot be
// trusted to say what was delivered.
func (r *Relay) batchFailures(rows []pendingRow, err error, failed map[int64]error) bool {
	var be *core.BatchError
	if !errors.As(err, &be) {
		return false
	}
	type copyOf struct{ eventID, topic string }
	byCopy := make(map[copyOf]int64, len(rows))
	copies := make(map[string][]int64, len(rows))
	for i := range rows {
		byCopy[copyOf{rows[i].eventID, rows[i].topic}] = rows[i].id
		copies[rows[i].eventID] = append(copies[rows[i].eventID], rows[i].id)
	}
	named := make([][]int64, len(be.Errors))
	for i, me := range be.Errors {
		named[i] = copies[me.UUID]
		if id, ok := byCopy[copyOf{me.UUID, me.Topic}]; ok {
			named[i] = []int64{id}
		} else if me.Topic != "" {
			named[i] = nil
		}
		if len(named[i]) == 0 || me.Err == nil {
			whole := fmt.Errorf("outbox: the publisher's BatchError names message %q (topic %q), which the call did not hold, or has no error for it; the whole call counts as failed: %w", me.UUID, me.Topic, err)
			failAll(rows, unavailable(whole), failed)
			return true
		}
	}
	if len(be.Errors) == 0 {
		failAll(rows, unavailable(fmt.Errorf("outbox: the publisher returned a BatchError naming no message; the whole call counts as failed: %w", err)), failed)
		return true
	}
	for i, me := range be.Errors {
		for _, id := range named[i] {
			failed[id] = me.Err
		}
	}
	return true
}

func failAll(rows []pendingRow, err error, failed map[int64]error) {
	for i := range rows {
		failed[rows[i].id] = err
	}
}

func sameTopic(rows []pendingRow) bool {
	for i := range rows {
		if rows[i].topic != rows[0].topic {
			return false
		}
	}
	return true
}

// publishRun publishes rows of one topic in one call and records the
// failures in failed. A publisher that fails the call whole has the
// messages at fault found one at a time (findAtFault).
func (r *Relay) publishRun(rows []pendingRow, failed map[int64]error) (outage error) {
	msgs := make([]*message.Message, len(rows))
	for i := range rows {
		msgs[i] = rows[i].message()
	}
	err := r.cfg.Publisher.Publish(rows[0].topic, msgs...)
	if err == nil || r.batchFailures(rows, err, failed) {
		return nil
	}
	if len(rows) == 1 {
		// Alone in its call: an event found at fault before (charged,
		// and back after its backoff) is taken to be at fault again;
		// else nothing in the call tells.
		if rows[0].attempts > 0 {
			failed[rows[0].id] = failedAlone(err)
		} else {
			failed[rows[0].id] = untold(err)
		}
		return nil
	}
	return r.findAtFault(rows, failed)
}

// findAtFault sends rows one at a time, in order, after the publisher
// failed them in one call, holding back the rest of a key once one of its
// messages fails (as a publisher that returns a BatchError does). A
// failure is read by what follows it:
//
//   - permanent (isPermanent): the event is at fault for good;
//   - in a pass in which other messages went out, fewer than faultsInARow
//     failures in a row: the event failed alone and is at fault, for now
//     (failedAlone: an attempt is charged, even if its error says
//     temporary, as a transport that drops the connection on a message it
//     refuses does);
//   - faultsInARow failures in a row: the publisher is unavailable. The
//     search stops there, those failures charge nothing, and the events
//     not tried are failed with errNotTried.
//
// A pass in which nothing went out charges nothing (but permanent
// failures), and is an outage.
func (r *Relay) findAtFault(rows []pendingRow, failed map[int64]error) (outage error) {
	held := map[string]error{}
	var run []int64 // the ids of the failures since the last message that went out
	wentOut := false
	for i := range rows {
		if err, ok := held[rows[i].key]; ok {
			failed[rows[i].id] = err
			continue
		}
		err := r.cfg.Publisher.Publish(rows[i].topic, rows[i].message())
		if err == nil {
			wentOut = true
			for _, id := range run {
				failed[id] = failedAlone(failed[id])
			}
			run = run[:0]
			continue
		}
		failed[rows[i].id] = err
		held[rows[i].key] = fmt.Errorf("held behind a failed event of its key: %w", err)
		if isPermanent(err) {
			continue
		}
		if run = append(run, rows[i].id); len(run) == faultsInARow {
			for _, row := range rows[i+1:] {
				if _, ok := failed[row.id]; !ok {
					failed[row.id] = errNotTried
				}
			}
			outage = err
			break
		}
	}
	// The failures at the end of the pass: at fault when messages went
	// out before them and they were too few to say an outage began.
	mark := unavailable
	if wentOut && outage == nil {
		mark = failedAlone
	}
	for _, id := range run {
		failed[id] = mark(failed[id])
	}
	if !wentOut && outage == nil && len(run) > 0 {
		outage = failed[run[0]]
	}
	return outage
}

// faultsInARow is how many failures in a row, one message at a time, say
// that a publisher is unavailable rather than its messages at fault.
const faultsInARow = 3
