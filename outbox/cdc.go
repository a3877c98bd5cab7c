package outbox

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/backoff"
)

// CDCRelayConfig configures a CDCRelay.
type CDCRelayConfig struct {
	// RelayConfig configures the relay's polling half, a Relay over the
	// pending set, which publishes what the stream hands to it: retries
	// of failed events, requeued dead letters, replays, the events held
	// behind them, and what a recovery from an invalidated slot queues.
	// Publisher is required. Schema, BatchSize (also the most events of
	// a stream batch), MaxAttempts, RetryMin, RetryMax, OutageBackoffMax,
	// SkipDeadLetteredKeys, SyncCommit, Metrics and Logger apply to the
	// stream too; the others only to the polling half.
	RelayConfig
	// Slot names the replication slot and the publication the relay
	// streams from: the relays of one group share it, one of them streams
	// at a time, the others wait as standbys. Create them with
	// Admin.CreateCDC. Defaults to DefaultSlot(Schema). Run one CDC group
	// per schema: the groups would share the pending set.
	Slot string
	// FlushInterval is the most time an event read from the stream waits
	// for its batch to fill before it is published. Defaults to 5ms.
	FlushInterval time.Duration
	// StatusInterval is the most time between two reports of the relay's
	// confirmed position to the server. Keep it well below the server's
	// wal_sender_timeout (60s by default), which ends a stream that stays
	// silent longer. Defaults to 10s.
	StatusInterval time.Duration
}

// CDCRelay ships events from the outbox to a Watermill publisher by change
// data capture: it streams the committed inserts of outbox_event from
// PostgreSQL's WAL through logical replication (pgoutput, a publication on
// the table, one replication slot per relay group), publishes them in
// commit order in batches, marks them published, and only then confirms
// the slot's position: a crash, a broker outage or a database restart
// streams again from the last confirmed position, so nothing is lost, and
// delivery is at least once. Writers write with WriterConfig.CDC. See the
// package doc, "Change data capture".
type CDCRelay struct {
	cfg     CDCRelayConfig
	pool    *pgxpool.Pool
	log     watermill.LoggerAdapter
	slot    string
	sql     cdcSQL
	sweeper *Relay
	repl    *pgconn.Config

	publication string
}

// NewCDCRelay returns a CDCRelay. It does not touch the database or the
// broker until Run.
func NewCDCRelay(pool *pgxpool.Pool, cfg CDCRelayConfig) (*CDCRelay, error) {
	if pool == nil {
		return nil, configError("NewCDCRelay needs a pool")
	}
	sweeper, err := NewRelay(pool, cfg.RelayConfig)
	if err != nil {
		return nil, err
	}
	sweeper.cdcHalf = true
	sweeper.sql = newRelaySQL(sweeper.schema, sweeper.cfg.SyncCommit, true)
	cfg.RelayConfig = sweeper.cfg // with its defaults
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = 5 * time.Millisecond
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 10 * time.Second
	}
	if cfg.FlushInterval < 0 || cfg.StatusInterval < 0 {
		return nil, configError("CDCRelayConfig.FlushInterval and StatusInterval must not be negative")
	}
	if cfg.Slot == "" {
		cfg.Slot = DefaultSlot(sweeper.schema)
	}
	if !slotName.MatchString(cfg.Slot) {
		return nil, configError("CDCRelayConfig.Slot %q: use 1-61 lower-case letters, digits or underscores", cfg.Slot)
	}
	if m := sweeper.metrics; m != nil && m.admin != nil && m.admin.cdcSlot == "" {
		m.admin.cdcSlot = cfg.Slot // the slot gauges read this relay's slot
	}
	repl := pool.Config().ConnConfig.Config.Copy()
	params := map[string]string{}
	for k, v := range repl.RuntimeParams {
		params[k] = v
	}
	params["replication"] = "database"
	// The stream's text form of payload_bytes is bytea's output: hex is
	// what the relay decodes, whatever the server, database or role
	// sets.
	params["bytea_output"] = "hex"
	repl.RuntimeParams = params
	c := &CDCRelay{
		cfg:     cfg,
		pool:    pool,
		log:     cfg.Logger.With(watermill.LogFields{"component": "outbox.CDCRelay", "schema": sweeper.schema, "slot": cfg.Slot}),
		slot:    cfg.Slot,
		sql:     newCDCSQL(sweeper.schema),
		sweeper: sweeper,
		repl:    repl,
	}
	c.publication = "'" + strings.ReplaceAll(cfg.Slot, "'", "''") + "'"
	return c, nil
}

// Run streams events until ctx ends, then publishes and confirms the batch
// it has read and returns nil.
//
// At start it returns an error at once when the server's wal_level is not
// logical (wrapping ErrWALLevel), when the publication or the slot does
// not exist (ErrNoSlot), or when the outbox tables are missing or the role
// lacks a privilege. A slot found invalidated (it kept more WAL than
// max_slot_wal_keep_size) is logged as an error, counted, replaced by a
// new one, and every event not yet published is queued from the log by
// state: nothing is lost. Other failures are logged and retried.
func (c *CDCRelay) Run(ctx context.Context) error {
	if err := c.sweeper.probe(ctx); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := c.check(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		var pgErr *pgconn.PgError
		if errors.Is(err, ErrWALLevel) || errors.Is(err, ErrNoSlot) ||
			(errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "3F"))) {
			return err
		}
		wait := backoff.Exponential(attempt, 100*time.Millisecond, c.cfg.OutageBackoffMax)
		c.log.Error("CDC relay cannot reach the database at start; retrying", err, watermill.LogFields{"retry_in": wait.String()})
		backoff.Sleep(ctx, wait)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = c.sweeper.Run(ctx) // probed above; returns nil when ctx ends
	}()
	c.stream(ctx)
	wg.Wait()
	return nil
}

// check refuses a server without logical decoding and a group not set up.
func (c *CDCRelay) check(ctx context.Context) error {
	if err := checkWALLevel(ctx, c.pool); err != nil {
		return err
	}
	var exists bool
	if err := c.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, c.slot).Scan(&exists); err != nil {
		return fmt.Errorf("outbox: read publication %q: %w", c.slot, err)
	}
	if !exists {
		return fmt.Errorf("%w: publication %q does not exist", ErrNoSlot, c.slot)
	}
	_, err := c.resolve(ctx)
	return err
}

// resolve returns the name of the group's healthy slot, recovering from an
// invalidated one first.
func (c *CDCRelay) resolve(ctx context.Context) (string, error) {
	have, err := slots(ctx, c.pool, c.slot)
	if err != nil {
		return "", err
	}
	var healthy, lost []string
	for _, s := range have {
		if s.lost() {
			lost = append(lost, s.name)
		} else {
			healthy = append(healthy, s.name)
		}
	}
	if len(have) == 0 {
		return "", fmt.Errorf("%w: replication slot %q does not exist", ErrNoSlot, c.slot)
	}
	if len(lost) == 0 {
		if len(healthy) > 1 {
			c.log.Error("CDC relay group has two healthy replication slots; streaming from the first, drop the other", nil, watermill.LogFields{"slots": strings.Join(healthy, ",")})
		}
		return healthy[0], nil
	}
	return c.recoverSlot(ctx, lost, healthy)
}

// recoverSlot replaces an invalidated slot: a new slot under the pair's
// other name (unless a recovery cut short made it already), then every
// unpublished event of the log into the pending set, then the lost slot
// dropped. Each step is safe to run again, and the lost slot, dropped
// last, marks a recovery not finished.
func (c *CDCRelay) recoverSlot(ctx context.Context, lost, healthy []string) (string, error) {
	c.log.Error("CDC REPLICATION SLOT INVALIDATED: the server dropped the WAL it held (it kept more than max_slot_wal_keep_size); "+
		"creating a new slot and queuing every unpublished event from the log by state (nothing is lost; expect a scan of outbox_event and duplicates)",
		nil, watermill.LogFields{"lost": strings.Join(lost, ",")})
	c.sweeper.metrics.slotInvalidated()
	target := ""
	if len(healthy) > 0 {
		target = healthy[0]
	} else {
		pair := slotPair(c.slot)
		target = pair[0]
		if lost[0] == pair[0] {
			target = pair[1]
		}
		if err := createSlot(ctx, c.pool, target); err != nil {
			return "", err
		}
	}
	tag, err := c.pool.Exec(ctx, c.sql.backfill)
	if err != nil {
		return "", fmt.Errorf("outbox: recover from invalidated slot: queue the unpublished events: %w", err)
	}
	for _, name := range lost {
		if err := dropSlot(ctx, c.pool, name); err != nil {
			return "", err
		}
	}
	c.sweeper.signal()
	c.log.Info("CDC relay recovered from an invalidated slot", watermill.LogFields{"slot": target, "queued": tag.RowsAffected()})
	return target, nil
}

// stream runs streamOnce until ctx ends, reconnecting with backoff.
func (c *CDCRelay) stream(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		progressed, err := c.streamOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			failures = 0
		}
		failures++
		wait := backoff.Exponential(failures, 100*time.Millisecond, c.cfg.OutageBackoffMax)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: another relay of the group streams
			c.log.Info("CDC slot in use by another relay of the group; standing by", watermill.LogFields{"retry_in": wait.String()})
		} else {
			c.log.Error("CDC stream failed; reconnecting", err, watermill.LogFields{"retry_in": wait.String()})
		}
		backoff.Sleep(ctx, wait)
	}
}

// cdcStream is the state of one replication connection.
type cdcStream struct {
	conn      *pgconn.PgConn
	relations map[uint32]*cdcRelation
	rows      []pendingRow
	flushAt   time.Time
	inTx      bool
	// The end of the last transaction whose events are all in rows or
	// published, and the commit time of the oldest transaction with events
	// not yet confirmed.
	lastCommit pglogrepl.LSN
	oldest     time.Time
	txTime     time.Time
	// acked is the end of the last transaction published and marked;
	// idleEnd a position the server reported while nothing was in flight.
	acked, idleEnd, sent pglogrepl.LSN
	nextStatus           time.Time
}

func (s *cdcStream) confirmable() pglogrepl.LSN { return max(s.acked, s.idleEnd) }

// streamOnce streams on one replication connection until it fails, and
// reports whether it published anything.
func (c *CDCRelay) streamOnce(ctx context.Context) (progressed bool, err error) {
	slot, err := c.resolve(ctx)
	if err != nil {
		return false, err
	}
	conn, err := pgconn.ConnectConfig(ctx, c.repl)
	if err != nil {
		return false, fmt.Errorf("outbox: CDC: connect for replication: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + c.publication},
	})
	if err != nil {
		return false, fmt.Errorf("outbox: CDC: start replication from slot %q: %w", slot, err)
	}
	s := &cdcStream{conn: conn, relations: map[uint32]*cdcRelation{}, nextStatus: time.Now().Add(c.cfg.StatusInterval)}
	for {
		if ctx.Err() != nil {
			// Publish and confirm what was read: a graceful stop adds no
			// duplicates. Once: with the broker away, the batch is left
			// unconfirmed, and streamed again at the next start.
			return progressed, c.flush(context.WithoutCancel(ctx), s, ctx)
		}
		now := time.Now()
		if len(s.rows) >= c.cfg.BatchSize || (len(s.rows) > 0 && !now.Before(s.flushAt)) {
			if err := c.flush(ctx, s, ctx); err != nil {
				return progressed, err
			}
			progressed = true
			continue
		}
		if !now.Before(s.nextStatus) {
			if err := c.sendStatus(s); err != nil {
				return progressed, err
			}
		}
		deadline := s.nextStatus
		if len(s.rows) > 0 && s.flushAt.Before(deadline) {
			deadline = s.flushAt
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil || pgconn.Timeout(err) {
				continue
			}
			return progressed, fmt.Errorf("outbox: CDC: receive: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := c.handle(s, msg.Data); err != nil {
				return progressed, err
			}
		case *pgproto3.ErrorResponse:
			return progressed, fmt.Errorf("outbox: CDC: stream: %w", pgconn.ErrorResponseToPgError(msg))
		}
	}
}

// handle takes one CopyData message of the stream.
func (c *CDCRelay) handle(s *cdcStream, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("outbox: CDC: %w", err)
		}
		// With nothing read and unpublished, every transaction of the
		// publication before this position has been sent and handled:
		// confirming it lets the server recycle WAL that other tables
		// wrote.
		if len(s.rows) == 0 && !s.inTx && pkm.ServerWALEnd > s.idleEnd {
			s.idleEnd = pkm.ServerWALEnd
		}
		if pkm.ReplyRequested {
			s.nextStatus = time.Time{}
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("outbox: CDC: %w", err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("outbox: CDC: decode: %w", err)
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			rel, err := newCDCRelation(m)
			if err != nil {
				return err
			}
			s.relations[m.RelationID] = rel
		case *pglogrepl.BeginMessage:
			s.inTx = true
			s.txTime = m.CommitTime
		case *pglogrepl.InsertMessage:
			rel, ok := s.relations[m.RelationID]
			if !ok {
				return fmt.Errorf("outbox: CDC: insert into unknown relation %d", m.RelationID)
			}
			row, err := rel.row(m.Tuple)
			if err != nil {
				return err
			}
			if len(s.rows) == 0 {
				s.flushAt = time.Now().Add(c.cfg.FlushInterval)
			}
			if s.oldest.IsZero() {
				s.oldest = s.txTime
			}
			s.rows = append(s.rows, row)
		case *pglogrepl.CommitMessage:
			s.inTx = false
			s.lastCommit = m.TransactionEndLSN
			if len(s.rows) == 0 {
				// A transaction with no events of ours (or all of them
				// published already): nothing waits on it.
				s.acked = max(s.acked, m.TransactionEndLSN)
			}
		}
	}
	return nil
}

// flush publishes the rows read, marks them, and confirms the end of the
// last transaction they complete. ctx carries its statements; once stop
// has ended, a batch the broker cannot take is not tried again.
func (c *CDCRelay) flush(ctx context.Context, s *cdcStream, stop context.Context) error {
	if len(s.rows) > 0 {
		c.sweeper.metrics.slotAge(s.oldest)
		if err := c.publishRows(ctx, s, stop); err != nil {
			return err
		}
		s.rows = s.rows[:0]
	}
	s.acked = max(s.acked, s.lastCommit)
	if s.inTx {
		s.oldest = s.txTime // its later events are still to come
	} else {
		s.oldest = time.Time{}
	}
	c.sweeper.metrics.slotAge(s.oldest)
	return c.sendStatus(s)
}

func (c *CDCRelay) sendStatus(s *cdcStream) error {
	lsn := s.confirmable()
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn})
	if err != nil {
		return fmt.Errorf("outbox: CDC: report position: %w", err)
	}
	s.sent = lsn
	s.nextStatus = time.Now().Add(c.cfg.StatusInterval)
	return nil
}

// publishRows publishes a stream batch in order and records what became of
// it (tryBatch). While nothing goes out and nothing says the events are at
// fault (the broker is away), nothing is confirmed: the slot keeps the WAL,
// and the batch is tried again with back-off, the status reports going on
// meanwhile, until stop ends. ctx carries the statements.
func (c *CDCRelay) publishRows(ctx context.Context, s *cdcStream, stop context.Context) error {
	for attempt := 1; ; attempt++ {
		outage, err := c.tryBatch(ctx, s.rows)
		if err != nil || outage == nil {
			return err
		}
		c.sweeper.metrics.outage()
		if stop.Err() != nil {
			return fmt.Errorf("outbox: CDC: stopped while the broker was unavailable (the batch is not confirmed and is streamed again): %w", outage)
		}
		wait := backoff.Exponential(attempt, 50*time.Millisecond, c.cfg.OutageBackoffMax)
		c.log.Error("CDC batch failed; retrying", outage, watermill.LogFields{"retry_in": wait.String()})
		if err := c.waitReporting(ctx, s, wait); err != nil {
			return err
		}
	}
}

// tryBatch publishes a stream batch in one transaction that holds the
// lanes of its keys (cdcSQL.lockLanes): it sorts the rows (route),
// publishes those to publish, and records what went out (marked
// published), what failed (into the pending set, as the polling relay
// returns failed events) and what was held behind events of its key in the
// pending set (handed to it). When nothing went out and nothing says the
// events are at fault it returns outage, recording nothing.
func (c *CDCRelay) tryBatch(ctx context.Context, rows []pendingRow) (outage error, err error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: CDC: %w", err)
	}
	defer conn.Release()
	tx := conn.Conn()
	defer rollbackOpen(ctx, tx)
	out, diverted, err := c.routeVisible(ctx, tx, rows)
	if err != nil {
		return nil, err
	}
	var failed map[int64]error
	if len(out) > 0 {
		endSpan := traceBatch(ctx, out) // tracing.go
		var partial error
		failed, partial = c.sweeper.publish(out)
		endSpan(len(failed), partial)
		if allUncharged(out, failed) {
			var first error
			for _, e := range failed {
				first = e
				break
			}
			return fmt.Errorf("%w: %d events: %v", errOutage, len(out), first), nil
		}
	}
	return nil, c.record(ctx, tx, out, failed, diverted)
}

// routeVisible routes the batch (route) once the transactions that wrote
// its rows are visible to the statements that mark and hand them over: the
// server sends a transaction to the stream once its commit is in the WAL,
// a moment before other sessions see it, and a statement by id would then
// miss its rows (its events published and never marked, a failure or a
// hand-over never recorded). route finds some rows not yet visible: its
// transaction is rolled back, and it is tried again, for up to
// visibleWait; rows not visible then (deleted meanwhile: retention removes
// events long published) are taken as finished.
func (c *CDCRelay) routeVisible(ctx context.Context, tx *pgx.Conn, rows []pendingRow) (out []pendingRow, diverted []int64, err error) {
	deadline := time.Now().Add(visibleWait)
	for try := 1; ; try++ {
		out, diverted, err = c.route(ctx, tx, rows, time.Now().After(deadline))
		if !errors.Is(err, errNotVisible) {
			return out, diverted, err
		}
		rollbackOpen(ctx, tx)
		backoff.Sleep(ctx, backoff.Exponential(try, time.Millisecond, 50*time.Millisecond))
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
	}
}

// visibleWait is how long routeVisible waits for a stream batch's rows to be
// visible.
const visibleWait = 5 * time.Second

// errNotVisible says that rows of a stream batch are not visible yet.
var errNotVisible = errors.New("outbox: CDC: rows of the batch not visible yet")

// route begins the batch's transaction on tx, locks the lanes of its keys,
// and sorts its rows into those to publish (out) and those whose keys have
// events handed to the pending set (diverted: they go there too, behind
// them), in one round trip. Rows that need nothing more (the stream
// repeats what was published, discarded or dead-lettered) are in neither.
// It returns errNotVisible when a row is not visible yet, unless
// invisibleFinished: then such a row is in neither.
func (c *CDCRelay) route(ctx context.Context, tx *pgx.Conn, rows []pendingRow, invisibleFinished bool) (out []pendingRow, diverted []int64, err error) {
	keys := make([]string, 0, len(rows))
	var lanes []int16
	ids := make([]int64, len(rows))
	seen := map[string]bool{}
	for i := range rows {
		ids[i] = rows[i].id
		if !seen[rows[i].key] {
			seen[rows[i].key] = true
			keys = append(keys, rows[i].key)
			if !slices.Contains(lanes, rows[i].lane) {
				lanes = append(lanes, rows[i].lane)
			}
		}
	}
	b := &pgx.Batch{}
	for _, st := range c.sweeper.sql.beginStatements {
		b.Queue(st)
	}
	b.Queue(c.sql.lockLanes, lanes)
	b.Queue(c.sql.heldKeys, keys)
	b.Queue(c.sql.visible, ids)
	if invisibleFinished {
		b.Queue(c.sql.visibleIDs, ids)
	}
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	for range len(c.sweeper.sql.beginStatements) + 1 {
		if _, err := br.Exec(); err != nil {
			return nil, nil, fmt.Errorf("outbox: CDC: begin and lock the batch's lanes: %w", err)
		}
	}
	held, err := collectSet[string](br)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: CDC: read held keys: %w", err)
	}
	var nVisible int
	var done, visible []int64
	if err := br.QueryRow().Scan(&nVisible, &done); err != nil {
		return nil, nil, fmt.Errorf("outbox: CDC: read the batch's events: %w", err)
	}
	if invisibleFinished {
		if err := br.QueryRow().Scan(&visible); err != nil {
			return nil, nil, fmt.Errorf("outbox: CDC: read the batch's events: %w", err)
		}
	}
	if nVisible < len(rows) && !invisibleFinished {
		return nil, nil, errNotVisible
	}
	for _, r := range rows {
		switch {
		case slices.Contains(done, r.id) || invisibleFinished && !slices.Contains(visible, r.id):
			// published, discarded or dead-lettered before (or gone)
		case held[r.key]:
			diverted = append(diverted, r.id)
		default:
			out = append(out, r)
		}
	}
	return out, diverted, br.Close()
}

// collectSet reads the next result of br, of one column, as a set.
func collectSet[T comparable](br pgx.BatchResults) (map[T]bool, error) {
	rows, _ := br.Query()
	values, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, err
	}
	set := make(map[T]bool, len(values))
	for _, v := range values {
		set[v] = true
	}
	return set, nil
}

// record marks what of out went out published, returns what failed to
// the pending set, hands the diverted events to it, and commits tx, in one
// round trip.
func (c *CDCRelay) record(ctx context.Context, tx *pgx.Conn, out []pendingRow, failed map[int64]error, diverted []int64) error {
	var back unclaimed
	if len(failed) > 0 {
		back = c.sweeper.settleFailures(out, failed)
	}
	returned := make(map[int64]bool, len(back.ids))
	for _, id := range back.ids {
		returned[id] = true
	}
	published := make([]int64, 0, len(out))
	for _, r := range out {
		if !returned[r.id] {
			published = append(published, r.id)
		}
	}
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	b := &pgx.Batch{}
	if len(published) > 0 {
		b.Queue(c.sql.mark, published)
	}
	if len(back.ids) > 0 {
		b.Queue(c.sql.unclaim, back.ids, back.blocked, back.dead, back.nextAt, back.errs, back.charge)
	}
	if len(diverted) > 0 {
		b.Queue(c.sql.divert, diverted)
	}
	b.Queue("COMMIT")
	if err := tx.SendBatch(bctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: CDC: record %d published, %d failed and %d held events: %w", len(published), len(back.ids), len(diverted), err)
	}
	c.sweeper.metrics.batch(len(published), back)
	if len(back.ids) > 0 || len(diverted) > 0 {
		c.sweeper.signal()
	}
	return nil
}

// waitReporting waits d, reporting the (unchanged) position to the server
// meanwhile so that it does not end the silent stream.
func (c *CDCRelay) waitReporting(ctx context.Context, s *cdcStream, d time.Duration) error {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil
		}
		if !time.Now().Before(s.nextStatus) {
			if err := c.sendStatus(s); err != nil {
				return err
			}
		}
		step := min(left, time.Until(s.nextStatus))
		t := time.NewTimer(max(step, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("outbox: CDC: stopped while the broker was unavailable (the batch is not confirmed and is streamed again): %w", ctx.Err())
		case <-t.C:
		}
	}
}

// cdcRelation maps the columns of outbox_event, as the stream describes
// them, to the fields of a pendingRow.
type cdcRelation struct {
	id, eventID, aggType, aggID, eventType, topic, key, lane, payload, payloadBytes, headers, attempts int
}

func newCDCRelation(m *pglogrepl.RelationMessage) (*cdcRelation, error) {
	idx := map[string]int{}
	for i, col := range m.Columns {
		idx[col.Name] = i
	}
	r := &cdcRelation{}
	for name, field := range map[string]*int{
		"id": &r.id, "event_id": &r.eventID, "aggregate_type": &r.aggType, "aggregate_id": &r.aggID,
		"event_type": &r.eventType, "topic": &r.topic, "partition_key": &r.key, "lane": &r.lane, "payload": &r.payload,
		"payload_bytes": &r.payloadBytes, "headers": &r.headers, "attempts": &r.attempts,
	} {
		i, ok := idx[name]
		if !ok {
			return nil, fmt.Errorf("outbox: CDC: relation %s.%s has no column %s (is the publication on outbox_event?)", m.Namespace, m.RelationName, name)
		}
		*field = i
	}
	return r, nil
}

// row decodes an inserted outbox_event row from pgoutput's text format.
func (r *cdcRelation) row(t *pglogrepl.TupleData) (pendingRow, error) {
	col := func(i int) ([]byte, bool) {
		if i >= len(t.Columns) || t.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return nil, false
		}
		return t.Columns[i].Data, true
	}
	text := func(i int) string { b, _ := col(i); return string(b) }
	var p pendingRow
	id, err := strconv.ParseInt(text(r.id), 10, 64)
	if err != nil {
		return p, fmt.Errorf("outbox: CDC: decode id: %w", err)
	}
	p.id = id
	p.eventID, p.aggType, p.aggID, p.eventType = text(r.eventID), text(r.aggType), text(r.aggID), text(r.eventType)
	p.topic, p.key = text(r.topic), text(r.key)
	lane, err := strconv.ParseInt(text(r.lane), 10, 16)
	if err != nil {
		return p, fmt.Errorf("outbox: CDC: event %s: decode lane: %w", p.eventID, err)
	}
	p.lane = int16(lane)
	if b, ok := col(r.payload); ok {
		p.payload = b
	}
	if b, ok := col(r.payloadBytes); ok {
		// bytea's text form: \x and hex digits.
		if !strings.HasPrefix(string(b), `\x`) {
			return p, fmt.Errorf("outbox: CDC: event %s: payload_bytes not in hex format", p.eventID)
		}
		raw := make([]byte, hex.DecodedLen(len(b)-2))
		if _, err := hex.Decode(raw, b[2:]); err != nil {
			return p, fmt.Errorf("outbox: CDC: event %s: payload_bytes: %w", p.eventID, err)
		}
		p.payloadBytes = raw
	}
	if b, ok := col(r.headers); ok {
		p.headers = b
	}
	if a := text(r.attempts); a != "" {
		if n, err := strconv.Atoi(a); err == nil {
			p.attempts = n
		}
	}
	return p, nil
}
