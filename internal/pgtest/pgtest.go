// Package pgtest gives each test an isolated PostgreSQL schema with
// millrace's migrations applied, on the database named by DATABASE_URL
// (default postgres://postgres@127.0.0.1:5432/test). The make targets set
// DATABASE_URL to whatever scripts/pg-up.sh found or started.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/migrations"
)

// DefaultURL is used when DATABASE_URL is not set.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// URL returns DATABASE_URL, or DefaultURL.
func URL() string {
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DB is one test's isolated schema.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
}

// Options tune New.
type Options struct {
	// MaxConns is the pool size. Defaults to 8.
	MaxConns int32
	// NoMigrate leaves the schema name reserved but not created.
	NoMigrate bool
}

// New returns a pool and a fresh schema with every migration applied. The
// schema is dropped and the pool closed when the test ends.
func New(t testing.TB) *DB { return NewWith(t, Options{}) }

// NewWith is New with options.
func NewWith(t testing.TB, opts Options) *DB {
	t.Helper()
	db := &DB{Pool: Pool(t, opts.MaxConns), Schema: RandomName("t")}
	t.Cleanup(func() {
		if err := db.drop(); err != nil {
			t.Logf("pgtest: %v", err)
		}
	})
	if !opts.NoMigrate {
		if err := db.migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// Open is New for code that runs outside a test, such as Example
// functions: it connects to URL() and migrates a fresh schema. close drops
// the schema and closes the pool.
func Open(ctx context.Context, maxConns int32) (db *DB, close func(), err error) {
	pool, err := Connect(ctx, URL(), maxConns)
	if err != nil {
		return nil, nil, err
	}
	db = &DB{Pool: pool, Schema: RandomName("example")}
	close = func() {
		_ = db.drop()
		pool.Close()
	}
	if err := db.migrate(ctx); err != nil {
		close()
		return nil, nil, err
	}
	return db, close, nil
}

func (db *DB) migrate(ctx context.Context) error {
	m, err := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return fmt.Errorf("pgtest: migrate %s: %w", db.Schema, err)
	}
	return nil
}

func (db *DB) drop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+sqlident.Quote(db.Schema)+` CASCADE`); err != nil {
		return fmt.Errorf("drop schema %s: %w", db.Schema, err)
	}
	return nil
}

// Pool returns a pool on URL() that is closed when the test ends. It fails
// the test within seconds, naming the address, when PostgreSQL does not answer.
func Pool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	pool, err := Connect(context.Background(), URL(), maxConns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Connect opens a pool on url and checks it answers within five seconds.
func Connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	return ConnectTraced(ctx, url, maxConns, nil)
}

// ConnectTraced is Connect with tracer, unless nil, on the pool's
// connections (a *RoundTrips counts their round trips).
func ConnectTraced(ctx context.Context, url string, maxConns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgtest: parse DATABASE_URL: %w", err)
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	if maxConns <= 0 {
		maxConns = 8
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgtest: PostgreSQL at %s:%d (database %q) does not answer: %w; run scripts/pg-up.sh or set DATABASE_URL",
			cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database, err)
	}
	return pool, nil
}

// RandomName returns prefix_ followed by 12 random hex digits: a valid
// schema, topic or consumer-group name that no other test uses.
func RandomName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// RoundTrips is a pgx tracer that counts the round trips of the
// connections it is set on (ConnectTraced): each statement sent alone and
// each batch. With Texts set, it also counts the statements, alone
// or in a batch, by their text.
type RoundTrips struct {
	// Texts makes it count the statements by text; set it before the
	// first statement.
	Texts bool

	n     atomic.Int64
	mu    sync.Mutex
	texts map[string]int64
}

// N is the number of round trips so far.
func (r *RoundTrips) N() int64 { return r.n.Load() }

// Statements returns the statements so far by text (nil unless Texts).
func (r *RoundTrips) Statements() map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.texts)
}

// countLocked counts a statement; r.mu is held.
func (r *RoundTrips) countLocked(sql string) {
	if r.texts == nil {
		r.texts = map[string]int64{}
	}
	r.texts[sql]++
}

func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	if r.Texts {
		r.mu.Lock()
		r.countLocked(d.SQL)
		r.mu.Unlock()
	}
	return ctx
}
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	if r.Texts && d.Batch != nil {
		r.mu.Lock()
		for _, q := range d.Batch.QueuedQueries {
			r.countLocked(q.SQL)
		}
		r.mu.Unlock()
	}
	return ctx
}
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// EncodeAllocs returns the allocations pgx makes to encode v as a value of
// the type oid in binary, the format of a prepared statement's arguments.
func EncodeAllocs(t testing.TB, oid uint32, v any) float64 {
	t.Helper()
	m := pgtype.NewMap()
	var buf []byte
	var err error
	allocs := testing.AllocsPerRun(50, func() { buf, err = m.Encode(oid, pgtype.BinaryFormatCode, v, buf[:0]) })
	if err != nil {
		t.Fatalf("pgtest: encode %T as OID %d: %v", v, oid, err)
	}
	return allocs
}

// GenericPlan returns the plan PostgreSQL keeps for sql as a prepared
// statement once it stops planning it for each execution's arguments (the
// generic plan: EXPLAIN EXECUTE under plan_cache_mode force_generic_plan),
// on the tables as they are now. nparams is the number of sql's
// parameters; each must have a type the statement fixes (a cast).
func (db *DB) GenericPlan(t testing.TB, sql string, nparams int) string {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	args := strings.TrimSuffix(strings.Repeat("NULL, ", nparams), ", ")
	c := conn.Conn()
	defer c.Exec(ctx, "DEALLOCATE pgtest_generic_plan; RESET plan_cache_mode") //nolint:errcheck // the pool's connection: a failure closes it; not ALL, which would drop pgx's cached statements
	if _, err := c.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "PREPARE pgtest_generic_plan AS "+sql); err != nil {
		t.Fatalf("pgtest: prepare: %v", err)
	}
	return Explain(t, c, "pgtest_generic_plan", args)
}

// Explain returns the plan of EXECUTE name(args) on c, args as SQL
// literals: for a statement prepared on a connection in a state of the
// test's making (a transaction with its own settings).
func Explain(t testing.TB, c *pgx.Conn, name, args string) string {
	t.Helper()
	rows, err := c.Query(context.Background(), "EXPLAIN EXECUTE "+name+"("+args+")", pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("pgtest: explain: %v", err)
	}
	return strings.Join(lines, "\n")
}

// CheckUpsertPlan fails t unless sql's generic plan (GenericPlan) is an
// upsert arbitrated by index, with no join and no sequential scan: a plan
// that reads the table only through that index, whatever it held when the
// plan was made.
func (db *DB) CheckUpsertPlan(t testing.TB, sql string, nparams int, index string) {
	t.Helper()
	plan := db.GenericPlan(t, sql, nparams)
	if !strings.Contains(plan, "Conflict Arbiter Indexes: "+index) || strings.Contains(plan, "Join") || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("generic plan:\n%s\nwant an upsert arbitrated by %s, with no join and no sequential scan", plan, index)
	}
}

// Prepared is a statement prepared on a connection of its own, to see
// what PostgreSQL's plan cache does with it: Executions says how many of
// its executions ran the generic plan.
type Prepared struct {
	t    testing.TB
	conn *pgxpool.Conn
	name string
}

// Prepare prepares sql on a connection of db's pool, held until the test
// ends.
func (db *DB) Prepare(t testing.TB, sql string) *Prepared {
	t.Helper()
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sd, err := conn.Conn().Prepare(ctx, "pgtest_prepared", sql)
	if err != nil {
		conn.Release()
		t.Fatalf("pgtest: prepare: %v", err)
	}
	t.Cleanup(func() {
		// Only this statement: DEALLOCATE ALL would drop pgx's cached
		// statements behind its back, and the pool's next user of the
		// connection would find them gone.
		_ = conn.Conn().Deallocate(context.Background(), sd.Name)
		conn.Release()
	})
	return &Prepared{t: t, conn: conn, name: sd.Name}
}

// Execute executes the statement n times with args in a transaction it
// rolls back, and returns how many of its executions so far (these and
// earlier ones) ran the generic plan (pg_prepared_statements.generic_plans).
func (p *Prepared) Execute(n int, args ...any) (generic int64) {
	p.t.Helper()
	ctx := context.Background()
	tx, err := p.conn.Begin(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for range n {
		if _, err := tx.Exec(ctx, p.name, args...); err != nil {
			p.t.Fatalf("pgtest: execute: %v", err)
		}
	}
	if err := tx.QueryRow(ctx, `SELECT generic_plans FROM pg_prepared_statements WHERE name = $1`, p.name).Scan(&generic); err != nil {
		p.t.Fatal(err)
	}
	return generic
}

// Explain returns the plan of an execution with args, given as SQL
// literals ("'{a,b}'").
func (p *Prepared) Explain(args ...string) string {
	p.t.Helper()
	return Explain(p.t, p.conn.Conn(), p.name, strings.Join(args, ", "))
}

// CheckKeepsGenericPlan fails t unless PostgreSQL, executing sql prepared
// ten times with args, keeps its generic plan after the five plans it
// makes for the arguments first (a statement planned again at every
// execution pays for a plan each time), and unless that plan (GenericPlan,
// sql's one parameter NULL) reads through index, with no sequential scan.
// The tables must hold rows, analyzed: on empty ones any plan is as cheap
// as the generic one. A statement of the form
// "col = ANY($1)" usually is (a plan for a few values always looks
// cheaper than the generic plan's array of unknown length); its array
// through an InitPlan, "col = ANY(ARRAY(SELECT unnest($1::type[])))",
// is of unknown length to both, and the generic plan is kept.
func (db *DB) CheckKeepsGenericPlan(t testing.TB, sql, index string, arg any) {
	t.Helper()
	if generic := db.Prepare(t, sql).Execute(10, arg); generic != 5 {
		t.Fatalf("generic plans in 10 executions = %d, want 5 (PostgreSQL plans it again for the arguments):\n%s", generic, sql)
	}
	if plan := db.GenericPlan(t, sql, 1); !strings.Contains(plan, index) || strings.Contains(plan, "Seq Scan") {
		t.Fatalf("generic plan:\n%s\nwant a scan of %s, with no sequential scan", plan, index)
	}
}
