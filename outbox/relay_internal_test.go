package outbox

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

type discard struct{}

func (discard) Publish(string, ...*message.Message) error { return nil }
func (discard) Close() error                              { return nil }

// After a LISTEN connection that worked is lost, the relay reconnects after
// the shortest wait, however many connections it lost before: the backoff
// grows only while reconnects fail. Without the reset, the 6th and 7th
// reconnect wait 3.2s and 6.4s.
func TestListenBackoffResetsAfterAConnection(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, Workers: 1, PollInterval: time.Minute, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	listener := func() int32 {
		var pid int32
		err := db.Pool.QueryRow(context.Background(),
			`SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE query = $1 AND state = 'idle'`,
			`LISTEN "`+r.channel+`"`).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	waitListener := func(old int32) (int32, time.Duration) {
		start := time.Now()
		deadline := start.Add(30 * time.Second)
		for {
			if pid := listener(); pid != 0 && pid != old {
				return pid, time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatal("relay did not LISTEN again within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	pid, _ := waitListener(0)
	for i := 1; i <= 7; i++ {
		if _, err := db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		var took time.Duration
		pid, took = waitListener(pid)
		if i >= 6 && took > 2500*time.Millisecond {
			t.Fatalf("reconnect %d after a working LISTEN connection took %v: the backoff did not reset", i, took)
		}
	}
}

// An empty poll allocates what it claims, not BatchSize rows. Not parallel:
// it reads the process's allocation counter.
func TestEmptyClaimAllocatesLittle(t *testing.T) {
	db := pgtest.New(t)
	r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, BatchSize: maxBatchSize})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	least := ^uint64(0)
	for range 5 {
		c, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, rows, err := r.takeBatch(ctx, c.Conn(), 0, 0, drainWindow) // a window of lanes, and their claim
		runtime.ReadMemStats(&after)
		c.Conn().Exec(ctx, "ROLLBACK") //nolint:errcheck
		c.Release()
		if err != nil || len(rows) != 0 {
			t.Fatalf("claim on an empty outbox: %d rows, %v", len(rows), err)
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	if least > 256<<10 {
		t.Fatalf("an empty claim with BatchSize %d allocated %d bytes", maxBatchSize, least)
	}
}

// A batch locks only the lanes it has work in: with one event pending, its
// lane alone (a lane lock writes WAL; a window of 64 for one event wrote
// more WAL than the events). Nothing pending: no lane locked, and the
// worker is told so. Its lane held by another batch: a window of other
// lanes, so the work behind goes on in parallel.
func TestBatchLocksOnlyTheLanesWithWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	r, w := relayAndWriter(t, db, RelayConfig{LanesPerBatch: 10})
	// takeBatch begins the batch's transaction on a connection out of
	// one: its BEGIN goes out with the first lock.
	take := func(tx *pgx.Conn, offset int) ([]int16, error) {
		lanes, _, err := r.takeBatch(ctx, tx, 0, offset, lookForWork)
		if st := tx.PgConn().TxStatus(); st != 'T' {
			t.Fatalf("after takeBatch the connection is in transaction status %q; want in a transaction", st)
		}
		return lanes, err
	}
	begin := func() *pgx.Conn {
		c, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Conn().Exec(ctx, "ROLLBACK"); c.Release() }) //nolint:errcheck
		return c.Conn()
	}
	rollback := func(tx *pgx.Conn) {
		if _, err := tx.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	}

	tx := begin()
	if lanes, err := take(tx, 0); err != errNothingPending || len(lanes) != 0 {
		t.Fatalf("empty outbox: lanes %v, %v; want none, errNothingPending", lanes, err)
	}
	rollback(tx)

	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	lane := Lane("k")
	holder := begin()
	lanes, err := take(holder, 0)
	if err != nil || len(lanes) != 1 || lanes[0] != lane {
		t.Fatalf("one event pending: lanes %v, %v; want [%d]", lanes, err, lane)
	}
	other := begin()
	if lanes, err := take(other, 0); err != errNothingPending {
		t.Fatalf("its lane held, nothing else pending: lanes %v, %v; want errNothingPending", lanes, err)
	}
	rollback(other)

	// A backlog (at least BatchSize events) whose head is in held lanes:
	// a window of the others, for the events behind the head.
	small, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, LanesPerBatch: 10, BatchSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "k2", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	other = begin()
	lanes, _, err = small.takeBatch(ctx, other, 0, int(lane), lookForWork)
	if err != nil || len(lanes) != 10 || slices.Contains(lanes, lane) {
		t.Fatalf("the backlog's head held: lanes %v, %v; want a window of 10 others", lanes, err)
	}
	rollback(other)

	// A worker draining a backlog (its last batch was full) locks a window
	// without looking for work first.
	other = begin()
	lanes, _, err = r.takeBatch(ctx, other, 0, int(lane), drainWindow)
	if err != nil || len(lanes) != 10 || slices.Contains(lanes, lane) {
		t.Fatalf("draining: lanes %v, %v; want a window of 10 lanes not held", lanes, err)
	}
}

// A speculative batch (no NOTIFY announced work: a look on a timer) asks
// first, outside a transaction, whether
// anything is claimable: nothing, or nothing but an event waiting out its
// retry, costs that one round trip and leaves no transaction to roll back;
// work is claimed as by any batch.
func TestSpeculativeLookAsksFirst(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	r, w := relayAndWriter(t, db, RelayConfig{LanesPerBatch: 10})
	take := func(wantTx byte) ([]int16, []pendingRow, error) {
		c, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
		defer c.Conn().Exec(ctx, "ROLLBACK") //nolint:errcheck
		lanes, rows, err := r.takeBatch(ctx, c.Conn(), 0, 0, askFirst)
		if st := c.Conn().PgConn().TxStatus(); st != wantTx {
			t.Fatalf("after a speculative takeBatch the connection is in transaction status %q; want %q", st, wantTx)
		}
		return lanes, rows, err
	}
	if lanes, _, err := take('I'); err != errNothingPending || len(lanes) != 0 {
		t.Fatalf("empty outbox: lanes %v, %v; want none, errNothingPending", lanes, err)
	}

	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE "`+db.Schema+`".outbox_pending SET blocked = true, next_attempt_at = now() + interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if lanes, _, err := take('I'); err != errNothingPending || len(lanes) != 0 {
		t.Fatalf("an event waiting out its retry and one held behind it: lanes %v, %v; want none, errNothingPending", lanes, err)
	}

	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "k2", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	lanes, rows, err := take('T')
	if err != nil || len(lanes) != 1 || lanes[0] != Lane("k2") || len(rows) != 1 || rows[0].key != "k2" {
		t.Fatalf("one event claimable: lanes %v, %d rows, %v; want [%d] and its event", lanes, len(rows), err, Lane("k2"))
	}
}

// Events held behind a dead letter do not count as work: with more of them
// than a batch takes at the head of the outbox, the other keys' events
// behind them are still claimed (their lanes are the ones locked).
func TestHeldEventsAtTheHeadDoNotHideOtherWork(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	r, w := relayAndWriter(t, db, RelayConfig{BatchSize: 5})
	var held []Event
	for range 20 {
		held = append(held, Event{Topic: "t", PartitionKey: "dead-key", Payload: []byte(`{}`)})
	}
	if _, err := w.Write(ctx, held...); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE "`+db.Schema+`".outbox_pending SET blocked = true, dead = true WHERE id = (SELECT min(id) FROM "`+db.Schema+`".outbox_pending)`); err != nil {
		t.Fatal(err)
	}
	// Another key, in another lane.
	key := "live-0"
	for i := 1; Lane(key) == Lane("dead-key"); i++ {
		key = "live-" + strconv.Itoa(i)
	}
	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: key, Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	tx := c.Conn()
	defer tx.Exec(ctx, "ROLLBACK") //nolint:errcheck
	lanes, rows, err := r.takeBatch(ctx, tx, 0, 0, lookForWork)
	if err != nil || !slices.Contains(lanes, Lane(key)) {
		t.Fatalf("lanes %v, %v; want the lane of %s (%d)", lanes, err, key, Lane(key))
	}
	if err != nil || len(rows) != 1 || rows[0].key != key {
		t.Fatalf("claimed %d rows, %v; want the one event of %s", len(rows), err, key)
	}
}

// relayAndWriter returns a relay of cfg, publishing nowhere, and a Writer,
// both on db's schema.
func relayAndWriter(t *testing.T, db *pgtest.DB, cfg RelayConfig) (*Relay, *Writer) {
	t.Helper()
	cfg.Schema, cfg.Publisher = db.Schema, discard{}
	r, err := NewRelay(db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := NewWriter(db.Pool, WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return r, w
}

// tracedPoolAndWriter returns a pool of two connections whose round trips
// trips counts, for a relay, and a Writer on db's schema.
func tracedPoolAndWriter(t *testing.T, db *pgtest.DB) (*pgxpool.Pool, *pgtest.RoundTrips, *Writer) {
	t.Helper()
	trips := &pgtest.RoundTrips{}
	pool, err := pgtest.ConnectTraced(context.Background(), pgtest.URL(), 2, trips)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w, err := NewWriter(db.Pool, WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return pool, trips, w
}

// A batch that was not full asks whether anything is claimable in its
// COMMIT's round trip, not in one of its own: a batch is two round trips
// (the look with its claim, the COMMIT with the question), and its answer
// says whether the worker looks again at once (more) or waits for a
// NOTIFY. Before, the question (or the look again) was a third round trip
// after every batch of a trickle.
func TestBatchAsksForMoreWithItsCommit(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	pool, trips, w := tracedPoolAndWriter(t, db)
	// The publisher writes one event of another key while it publishes
	// the first batch: it is pending once that batch commits.
	var published []string
	writeDuring := true
	pub := publishFunc(func(_ string, ids ...string) {
		published = append(published, ids...)
		if writeDuring {
			writeDuring = false
			if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "later", Payload: []byte(`{}`)}); err != nil {
				t.Error(err)
			}
		}
	})
	r, err := NewRelay(pool, RelayConfig{Schema: db.Schema, Publisher: pub, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: "first", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	batch := func(wantMore bool) {
		t.Helper()
		before := trips.N()
		n, more, err := r.runBatch(ctx, 0, 0, lookForWork)
		if got := trips.N() - before; err != nil || n != 1 || more != wantMore || got != 2 {
			t.Fatalf("batch: %d events, more %v, %d round trips, %v; want 1 event, more %v, 2 round trips", n, more, got, err, wantMore)
		}
	}
	batch(true)  // the event written while it published is claimable
	batch(false) // nothing after the second
	if len(published) != 2 {
		t.Fatalf("published %d events; want 2", len(published))
	}
}

// A worker does not look for events in the lanes its siblings' batches
// hold: an event in such a lane is not its to claim until the sibling
// commits, and the sibling looks again after its batch. Before, a worker
// whose question saw such an event began a look that found the lane
// locked and rolled back: three round trips for a speculative look, two
// after a batch, for nothing; a third of the looks after a batch at 200
// sagas/s in make bench.
func TestWorkersLeaveTheirSiblingsLanesToThem(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	pool, trips, w := tracedPoolAndWriter(t, db)
	other := "k2" // a key in another lane than "k"
	for i := 3; Lane(other) == Lane("k"); i++ {
		other = fmt.Sprintf("k%d", i)
	}
	write := func(key string) {
		t.Helper()
		if _, err := w.Write(ctx, Event{Topic: "t", PartitionKey: key, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	var r *Relay
	held := func(worker int) []int16 {
		r.heldMu.Lock()
		defer r.heldMu.Unlock()
		return slices.Clone(r.held[worker])
	}
	var published []string
	inBatch := true
	pub := publishFunc(func(_ string, ids ...string) {
		published = append(published, ids...)
		if !inBatch {
			return
		}
		inBatch = false
		if got := held(0); !slices.Equal(got, []int16{Lane("k")}) {
			t.Errorf("while worker 0 publishes, it holds lanes %v; want [%d]", got, Lane("k"))
		}
		write("k") // behind the batch, in its lane
		before := trips.N()
		n, _, err := r.runBatch(ctx, 1, 0, askFirst)
		if got := trips.N() - before; n != 0 || err != errNothingPending || got != 1 {
			t.Errorf("worker 1's look with only worker 0's lane pending: %d events, %d round trips, %v; want none, 1 round trip (the question), errNothingPending", n, got, err)
		}
		write(other)
		if n, _, err := r.runBatch(ctx, 1, 0, askFirst); n != 1 || err != nil {
			t.Errorf("worker 1's look with an event in a free lane too: %d events, %v; want 1", n, err)
		}
	})
	var err error
	r, err = NewRelay(pool, RelayConfig{Schema: db.Schema, Publisher: pub, Workers: 2, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	write("k")
	// Worker 0's question after its batch sees the event behind it in its
	// own lane.
	if n, more, err := r.runBatch(ctx, 0, 0, lookForWork); n != 1 || !more || err != nil {
		t.Fatalf("worker 0's batch: %d events, more %v, %v; want 1, more", n, more, err)
	}
	if got := held(0); len(got) != 0 {
		t.Fatalf("after its batch worker 0 holds lanes %v; want none", got)
	}
	if n, more, err := r.runBatch(ctx, 0, 0, lookForWork); n != 1 || more || err != nil {
		t.Fatalf("worker 0's second batch: %d events, more %v, %v; want 1, no more", n, more, err)
	}
	if len(published) != 3 {
		t.Fatalf("published %d events; want 3", len(published))
	}
}

func TestWorthALook(t *testing.T) {
	r := &Relay{held: [][]int16{{1, 2}, {3}, nil}}
	many := make([]int16, questionLanes)
	for i := range many {
		many[i] = 1 // all held by worker 0, but more may be behind them
	}
	for _, c := range []struct {
		worker int
		lanes  []int16
		want   bool
	}{
		{2, nil, false},             // nothing claimable
		{2, []int16{1, 3}, false},   // all in siblings' lanes
		{2, []int16{1, 3, 4}, true}, // lane 4 is free
		{0, []int16{1, 2}, true},    // its own lanes
		{1, []int16{2, 1}, false},   // worker 0's
		{2, many, true},             // a full answer: there may be more
		{1, []int16{1, 1, 9}, true}, // lane 9 is free
	} {
		if got := r.worthALook(c.worker, c.lanes); got != c.want {
			t.Errorf("worker %d, lanes %v: worthALook %v; want %v", c.worker, c.lanes, got, c.want)
		}
	}
}

// The claim marks what it took through the log's primary key, also in the
// plan PostgreSQL keeps from a fresh, small log: without the batch's
// settings (hash and merge joins off), that plan hashed a sequential scan
// of the whole log and kept it as the log grew (over a relay's first
// minute at 1,000 events/s, 320-610 pages read per claim). The question
// whether anything is claimable walks the pending set's primary key: as
// an EXISTS it scanned the table from its first page, through every page
// of rows published since the last vacuum, to the live rows at its end.
func TestRelayReadsThroughKeysOnAFreshLog(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, Logger: watermill.NopLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	events, pending := sqlident.Table(db.Schema, "outbox_event"), sqlident.Table(db.Schema, "outbox_pending")
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+events+` (event_id, topic, partition_key, lane, payload)
SELECT gen_random_uuid(), 'orders', 'k' || g, g % 128, '{}' FROM generate_series(1, 20) g;
INSERT INTO `+pending+` (id, lane, partition_key) SELECT id, lane, partition_key FROM `+events); err != nil {
		t.Fatal(err)
	}
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	c := conn.Conn()
	for _, st := range []struct{ name, sql, args, want, table string }{
		{"claim", r.sql.claim, `'{0,1,2,3,4,5,6,7}', 2000, true`, "using outbox_event_pkey on outbox_event", "outbox_event"},
		{"claimNoted", r.sql.claimNoted, `2000, true`, "using outbox_event_pkey on outbox_event", "outbox_event"},
		{"claimableLanes", r.sql.claimableLanes, `true, 16`, "using outbox_pending_pkey on outbox_pending q", "outbox_pending"},
	} {
		for _, s := range append(slices.Clone(r.sql.beginStatements), `SET LOCAL plan_cache_mode = force_generic_plan`) {
			if _, err := c.Exec(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Prepare(ctx, "pgtest_claim", st.sql); err != nil {
			t.Fatal(err)
		}
		plan := pgtest.Explain(t, c, "pgtest_claim", st.args)
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		if err := c.Deallocate(ctx, "pgtest_claim"); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan, st.want) || strings.Contains(plan, "Seq Scan on "+st.table) {
			t.Errorf("%s: generic plan on a fresh log of 20 events:\n%s\nwant %q, with no sequential scan of %s", st.name, plan, st.want, st.table)
		}
	}
}

// A batch's transaction runs with hash and merge joins off and, unless
// SyncCommit, synchronous_commit off: all set by one statement behind
// BEGIN, in the round trip of the batch's first lock, and for the
// transaction only, since the pool's connections serve the service too.
func TestBatchSettingsAreOneStatementForItsTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 2})
	ctx := context.Background()
	for _, sync := range []bool{false, true} {
		r, err := NewRelay(db.Pool, RelayConfig{Schema: db.Schema, Publisher: discard{}, Logger: watermill.NopLogger{}, SyncCommit: sync})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(r.sql.beginStatements); n != 2 {
			t.Errorf("SyncCommit %v: %d statements begin a batch (%q), want BEGIN and one SELECT of the settings", sync, n, r.sql.beginStatements)
		}
		conn, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := conn.Conn()
		b := r.batch(true)
		for _, s := range []string{"synchronous_commit", "enable_hashjoin", "enable_mergejoin"} {
			b.Queue("SELECT current_setting('" + s + "')")
		}
		br := c.SendBatch(ctx, b)
		for range r.sql.beginStatements {
			if _, err := br.Exec(); err != nil {
				t.Fatal(err)
			}
		}
		want := map[bool]string{false: "off", true: "on"}[sync]
		for _, w := range []struct{ name, want string }{{"synchronous_commit", want}, {"enable_hashjoin", "off"}, {"enable_mergejoin", "off"}} {
			var got string
			if err := br.QueryRow().Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != w.want {
				t.Errorf("SyncCommit %v: %s is %q in a batch's transaction, want %q", sync, w.name, got, w.want)
			}
		}
		if err := br.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		var after string
		if err := c.QueryRow(ctx, "SELECT current_setting('synchronous_commit') || current_setting('enable_hashjoin')").Scan(&after); err != nil {
			t.Fatal(err)
		}
		if after != "onon" {
			t.Errorf("SyncCommit %v: after the batch's transaction the connection has synchronous_commit and enable_hashjoin %q, want both back on", sync, after)
		}
		conn.Release()
	}
}
