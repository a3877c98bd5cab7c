package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millrace/millrace/internal/sqlident"
)

// FS holds the raw migration files, NNN_name.up.sql and NNN_name.down.sql,
// under sql/. The statements are not schema-qualified; run them with
// search_path set to your schema.
//
//go:embed sql/*.sql
var FS embed.FS

// Migration is one numbered step of the schema.
type Migration struct {
	Version int    // 1, 2, ...
	Name    string // the file name's middle part, e.g. "outbox"
	Up      string // SQL applied by Up
	Down    string // SQL that undoes Up
}

var (
	// ErrDatabaseNewer is returned when the database has a migration applied
	// that this version of millrace does not know. Nothing is changed.
	ErrDatabaseNewer = errors.New("millrace: database schema is newer than this version of millrace knows")
	// ErrUnknownVersion is returned by Down for a target version that does
	// not exist.
	ErrUnknownVersion = errors.New("millrace: unknown migration version")
)

var all = mustLoad()

var fileName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

func mustLoad() []Migration {
	entries, err := fs.ReadDir(FS, "sql")
	if err != nil {
		panic(err)
	}
	byVersion := map[int]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			panic("migrations: bad file name " + e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		body, err := FS.ReadFile("sql/" + e.Name())
		if err != nil {
			panic(err)
		}
		mig := byVersion[v]
		if mig == nil {
			mig = &Migration{Version: v, Name: m[2]}
			byVersion[v] = mig
		}
		if m[3] == "up" {
			mig.Up = string(body)
		} else {
			mig.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for v := 1; v <= len(byVersion); v++ {
		mig, ok := byVersion[v]
		if !ok || mig.Up == "" || mig.Down == "" {
			panic(fmt.Sprintf("migrations: version %d missing or incomplete", v))
		}
		out = append(out, *mig)
	}
	return out
}

// All returns every migration this version of millrace knows, in order.
func All() []Migration { return slices.Clone(all) }

// Latest returns the highest migration version this version of millrace knows.
func Latest() int { return all[len(all)-1].Version }

// formerChecksums are checksums a migration had in an earlier release whose
// text differs from today's in comments only: Validate accepts them, so a
// database migrated by that release is not reported as changed.
var formerChecksums = map[int][]string{
	1: {"4f61d71fb19a5f5c"}, // comments reworded
	2: {"6cbc49f4692acf2d"}, // comments reworded
}

// sameChecksum reports whether sum, stored when mig was applied, is mig's.
func sameChecksum(mig Migration, sum string) bool {
	return sum == checksum(mig) || slices.Contains(formerChecksums[mig.Version], sum)
}

func checksum(m Migration) string {
	sum := sha256.Sum256([]byte(m.Up))
	return hex.EncodeToString(sum[:8])
}

// Config configures a Migrator.
type Config struct {
	// Schema is the PostgreSQL schema that holds millrace's tables. It is
	// created if missing. It must be 1-63 lower-case letters, digits or
	// underscores. Defaults to "millrace".
	Schema string
}

// Migrator applies millrace's migrations to one schema. It is safe for
// concurrent use, and several processes may migrate the same database at
// once: each run takes a transaction-scoped advisory lock for the schema.
type Migrator struct {
	pool   *pgxpool.Pool
	schema string
}

// New returns a Migrator for the schema in cfg. It does not touch the
// database.
func New(pool *pgxpool.Pool, cfg Config) (*Migrator, error) {
	schema, err := sqlident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	return &Migrator{pool: pool, schema: schema}, nil
}

// Schema returns the schema the Migrator works on.
func (m *Migrator) Schema() string { return m.schema }

// Result says what a migration run did.
type Result struct {
	From    int   // version before the run
	To      int   // version after the run
	Applied []int // versions applied (Up) or reverted (Down), in the order run
}

// Up applies every migration not yet applied, in one transaction.
func (m *Migrator) Up(ctx context.Context) (*Result, error) {
	return m.inTx(ctx, func(tx pgx.Tx) (*Result, error) { return m.up(ctx, tx) })
}

func (m *Migrator) up(ctx context.Context, tx pgx.Tx) (*Result, error) {
	return m.run(ctx, tx, func(current int, applied map[int]string) (*Result, error) {
		res := &Result{From: current, To: current}
		for _, mig := range all {
			if _, done := applied[mig.Version]; done {
				continue
			}
			if _, err := tx.Exec(ctx, mig.Up); err != nil {
				return nil, fmt.Errorf("millrace: migration %03d_%s up: %w", mig.Version, mig.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migration (version, name, checksum) VALUES ($1, $2, $3)`,
				mig.Version, mig.Name, checksum(mig)); err != nil {
				return nil, fmt.Errorf("millrace: record migration %d: %w", mig.Version, err)
			}
			res.Applied = append(res.Applied, mig.Version)
			res.To = mig.Version
		}
		return res, nil
	})
}

// Down reverts applied migrations above version, newest first, in one
// transaction. Down(ctx, 0) removes all of millrace's tables (the schema and
// its migration table stay).
func (m *Migrator) Down(ctx context.Context, version int) (*Result, error) {
	return m.inTx(ctx, func(tx pgx.Tx) (*Result, error) { return m.down(ctx, tx, version) })
}

func (m *Migrator) down(ctx context.Context, tx pgx.Tx, version int) (*Result, error) {
	if version < 0 || version > Latest() {
		return nil, fmt.Errorf("%w: %d (known: 0..%d)", ErrUnknownVersion, version, Latest())
	}
	return m.run(ctx, tx, func(current int, applied map[int]string) (*Result, error) {
		res := &Result{From: current, To: current}
		for i := len(all) - 1; i >= 0; i-- {
			mig := all[i]
			if mig.Version <= version {
				break
			}
			if _, done := applied[mig.Version]; !done {
				continue
			}
			if _, err := tx.Exec(ctx, mig.Down); err != nil {
				return nil, fmt.Errorf("millrace: migration %03d_%s down: %w", mig.Version, mig.Name, err)
			}
			if _, err := tx.Exec(ctx, `DELETE FROM schema_migration WHERE version = $1`, mig.Version); err != nil {
				return nil, fmt.Errorf("millrace: unrecord migration %d: %w", mig.Version, err)
			}
			res.Applied = append(res.Applied, mig.Version)
			res.To = mig.Version - 1
		}
		return res, nil
	})
}

// Version returns the highest applied migration version, 0 when none is.
func (m *Migrator) Version(ctx context.Context) (int, error) {
	applied, err := m.applied(ctx, m.pool)
	if err != nil {
		return 0, err
	}
	return maxVersion(applied), nil
}

// ValidationError lists how the database differs from the migrations this
// version of millrace knows.
type ValidationError struct {
	Schema  string
	Pending []int // known but not applied
	Unknown []int // applied but not known (the database is newer)
	Changed []int // applied with a different Up script than the one known
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("millrace: schema %q is not at the expected version: pending %v, unknown %v, changed %v",
		e.Schema, e.Pending, e.Unknown, e.Changed)
}

// Validate returns nil when every known migration is applied, unchanged, and
// nothing newer is; otherwise a *ValidationError. It changes nothing.
func (m *Migrator) Validate(ctx context.Context) error {
	applied, err := m.applied(ctx, m.pool)
	if err != nil {
		return err
	}
	verr := &ValidationError{Schema: m.schema}
	for _, mig := range all {
		sum, ok := applied[mig.Version]
		switch {
		case !ok:
			verr.Pending = append(verr.Pending, mig.Version)
		case !sameChecksum(mig, sum):
			verr.Changed = append(verr.Changed, mig.Version)
		}
	}
	verr.Unknown = unknownVersions(applied)
	if verr.Pending == nil && verr.Unknown == nil && verr.Changed == nil {
		return nil
	}
	return verr
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// applied returns version -> checksum of applied migrations; empty when the
// schema or its migration table does not exist yet.
func (m *Migrator) applied(ctx context.Context, q querier) (map[int]string, error) {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, sqlident.Table(m.schema, "schema_migration")).Scan(&exists); err != nil {
		return nil, fmt.Errorf("millrace: read migration state of schema %q: %w", m.schema, err)
	}
	out := map[int]string{}
	if !exists {
		return out, nil
	}
	rows, err := q.Query(ctx, `SELECT version, checksum FROM `+sqlident.Table(m.schema, "schema_migration"))
	if err != nil {
		return nil, fmt.Errorf("millrace: read migration state of schema %q: %w", m.schema, err)
	}
	var v int
	var sum string
	_, err = pgx.ForEachRow(rows, []any{&v, &sum}, func() error { out[v] = sum; return nil })
	if err != nil {
		return nil, fmt.Errorf("millrace: read migration state of schema %q: %w", m.schema, err)
	}
	return out, nil
}

func (m *Migrator) inTx(ctx context.Context, fn func(pgx.Tx) (*Result, error)) (*Result, error) {
	tx, err := m.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("millrace: migrate: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op
	res, err := fn(tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("millrace: migrate: commit: %w", err)
	}
	return res, nil
}

// run locks the schema against other migrators, makes sure the schema and
// its migration table exist, refuses a database newer than the code, and
// calls fn with search_path set to the schema, restoring it afterwards.
func (m *Migrator) run(ctx context.Context, tx pgx.Tx, fn func(current int, applied map[int]string) (*Result, error)) (*Result, error) {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('millrace.migrate.' || $1::text, 0))`, m.schema); err != nil {
		return nil, fmt.Errorf("millrace: migrate: lock: %w", err)
	}
	var oldPath string
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&oldPath); err != nil {
		return nil, fmt.Errorf("millrace: migrate: %w", err)
	}
	applied, err := m.applied(ctx, tx)
	if err != nil {
		return nil, err
	}
	if unknown := unknownVersions(applied); unknown != nil {
		return nil, fmt.Errorf("%w: schema %q has version(s) %v applied, this millrace knows up to %d; upgrade millrace",
			ErrDatabaseNewer, m.schema, unknown, Latest())
	}
	setup := `CREATE SCHEMA IF NOT EXISTS ` + sqlident.Quote(m.schema) + `;
SET LOCAL search_path TO ` + sqlident.Quote(m.schema) + `;
CREATE TABLE IF NOT EXISTS schema_migration (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);`
	if _, err := tx.Exec(ctx, setup); err != nil {
		return nil, fmt.Errorf("millrace: migrate: prepare schema %q: %w", m.schema, err)
	}
	res, err := fn(maxVersion(applied), applied)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, oldPath); err != nil {
		return nil, fmt.Errorf("millrace: migrate: restore search_path: %w", err)
	}
	return res, nil
}

func maxVersion(applied map[int]string) int {
	v := 0
	for k := range applied {
		v = max(v, k)
	}
	return v
}

func unknownVersions(applied map[int]string) []int {
	var out []int
	for v := range applied {
		if v > Latest() || v < 1 {
			out = append(out, v)
		}
	}
	slices.Sort(out)
	return out
}

// Schemas returns the schemas of the database that hold millrace's tables
// (the migrations' own table, schema_migration, beside the outbox's,
// outbox_event), sorted by name: one per service that ran Up. A console or
// a tool over every service starts from it.
func Schemas(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT m.table_schema FROM information_schema.tables m
  JOIN information_schema.tables o ON o.table_schema = m.table_schema AND o.table_name = 'outbox_event'
 WHERE m.table_name = 'schema_migration'
 ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("migrations: list schemas: %w", err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("migrations: list schemas: %w", err)
	}
	return schemas, nil
}
