package sagatest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// env is what runs of a harness share: a migrated schema, the outbox
// relay shipping it, and the in-process transport the relay publishes to.
type env struct {
	db      *pgtest.DB // db.Pool commits without waiting for the disk
	closeDB func()
	writer  *outbox.Writer
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu        sync.Mutex
	published []published

	pendingSQL, idsSQL string
}

// published is a message the relay handed to the transport.
type published struct {
	topic string
	msg   *message.Message
}

// newEnv makes a schema and starts a relay on it.
func newEnv(ctx context.Context) (*env, error) {
	db, closeDB, err := pgtest.Open(ctx, 1)
	if err != nil {
		return nil, fmt.Errorf("sagatest: %w", err)
	}
	// Every connection of the harness commits without waiting for its WAL
	// flush: a test does not survive the machine's crash anyway, and a
	// commit then costs a fraction of a millisecond, not a disk flush.
	pcfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		closeDB()
		return nil, fmt.Errorf("sagatest: %w", err)
	}
	pcfg.MaxConns = 4 // the relay's listener and batch, a handler, a query
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		closeDB()
		return nil, fmt.Errorf("sagatest: %w", err)
	}
	dropSchema := closeDB
	closeDB = func() { pool.Close(); dropSchema() }
	db = &pgtest.DB{Pool: pool, Schema: db.Schema}
	e := &env{db: db, closeDB: closeDB,
		pendingSQL: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE NOT dead)`, sqlident.Table(db.Schema, "outbox_pending")),
		idsSQL:     fmt.Sprintf(`SELECT event_id::text, id FROM %s WHERE event_id = ANY($1::uuid[])`, sqlident.Table(db.Schema, "outbox_event")),
	}
	// A hint per transaction: the relay wakes at once for every write, and
	// polls rarely when idle. (A participant given a Writer of its own,
	// which hints at most every 1ms by default, may wait for the poll.)
	if e.writer, err = outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, NotifyInterval: time.Nanosecond}); err != nil {
		closeDB()
		return nil, err
	}
	relay, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Schema: db.Schema, Publisher: (*transport)(e),
		Workers: 1, LanesPerBatch: outbox.Lanes, PollInterval: 250 * time.Millisecond})
	if err != nil {
		closeDB()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.wg.Add(1)
	go func() { defer e.wg.Done(); _ = relay.Run(rctx) }()
	return e, nil
}

func (e *env) close() {
	e.cancel()
	e.wg.Wait()
	e.closeDB()
}

// transport is the relay's publisher: it keeps what it is given for the
// harness to deliver.
type transport env

func (t *transport) Publish(topic string, msgs ...*message.Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, m := range msgs {
		t.published = append(t.published, published{topic: topic, msg: m.Copy()})
	}
	return nil
}

func (t *transport) Close() error { return nil }

// drain waits until the relay published every committed outbox event, and
// returns what it published since the last drain, in outbox order.
func (e *env) drain(ctx context.Context) ([]published, map[string]int64, error) {
	give := time.Now().Add(30 * time.Second)
	wait := 100 * time.Microsecond
	for {
		var pending bool
		if err := e.db.Pool.QueryRow(ctx, e.pendingSQL).Scan(&pending); err != nil {
			return nil, nil, fmt.Errorf("sagatest: outbox: %w", err)
		}
		if !pending {
			break
		}
		if time.Now().After(give) {
			return nil, nil, fmt.Errorf("sagatest: the relay did not publish the outbox within 30s")
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Millisecond)
	}
	e.mu.Lock()
	got := e.published
	e.published = nil
	e.mu.Unlock()
	if len(got) == 0 {
		return nil, nil, nil
	}
	ids := make([]string, 0, len(got))
	for _, p := range got {
		ids = append(ids, p.msg.UUID)
	}
	rows, err := e.db.Pool.Query(ctx, e.idsSQL, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("sagatest: outbox ids: %w", err)
	}
	seq := map[string]int64{}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { seq[id] = n; return nil }); err != nil {
		return nil, nil, fmt.Errorf("sagatest: outbox ids: %w", err)
	}
	return got, seq, nil
}

// reset empties every table of the schema but millrace's fixed rows
// (the relay's lanes, the migration log), between runs.
func (e *env) reset(ctx context.Context) error {
	rows, err := e.db.Pool.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1
   AND tablename NOT IN ('outbox_lane', 'schema_migration') ORDER BY tablename`, e.db.Schema)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = sqlident.Table(e.db.Schema, n)
	}
	e.mu.Lock()
	e.published = nil
	e.mu.Unlock()
	if len(quoted) == 0 {
		return nil
	}
	// DELETE: TRUNCATE makes new files for every table, about a hundred
	// times slower on tables this small. A foreign key between the user's
	// tables may refuse a DELETE order; TRUNCATE ... CASCADE then.
	var b strings.Builder
	for _, q := range quoted {
		b.WriteString("DELETE FROM " + q + ";")
	}
	if _, err = e.db.Pool.Exec(ctx, b.String()); err != nil {
		_, err = e.db.Pool.Exec(ctx, `TRUNCATE `+strings.Join(quoted, ", ")+` CASCADE`)
	}
	return err
}
