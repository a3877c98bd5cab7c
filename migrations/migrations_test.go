package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/migrations"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// schemaDump describes every table, column, index and constraint in schema,
// so two states of the schema can be compared.
func schemaDump(t *testing.T, db *pgtest.DB) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
SELECT 'col ' || table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
  FROM information_schema.columns WHERE table_schema = $1
UNION ALL
SELECT 'idx ' || indexdef FROM pg_indexes WHERE schemaname = $1
UNION ALL
SELECT 'con ' || conname || ' ' || pg_get_constraintdef(c.oid)
  FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1
ORDER BY 1`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		b.WriteString(s + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestUpDownUpSameSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	m, err := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); err != nil || v != 0 {
		t.Fatalf("Version before = %d, %v; want 0", v, err)
	}
	res, err := m.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.From != 0 || res.To != migrations.Latest() || len(res.Applied) != migrations.Latest() {
		t.Fatalf("Up result = %+v", res)
	}
	if err := m.Validate(ctx); err != nil {
		t.Fatalf("Validate after Up: %v", err)
	}
	first := schemaDump(t, db)
	if !strings.Contains(first, "outbox_event") {
		t.Fatalf("no outbox_event after Up:\n%s", first)
	}

	res, err = m.Down(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.To != 0 {
		t.Fatalf("Down result = %+v", res)
	}
	if v, _ := m.Version(ctx); v != 0 {
		t.Fatalf("Version after Down = %d", v)
	}
	var verr *migrations.ValidationError
	if err := m.Validate(ctx); !errors.As(err, &verr) || len(verr.Pending) != migrations.Latest() {
		t.Fatalf("Validate after Down = %v; want every version pending", err)
	}
	if dump := schemaDump(t, db); strings.Contains(dump, "outbox_event") {
		t.Fatalf("outbox_event left after Down:\n%s", dump)
	}

	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if second := schemaDump(t, db); second != first {
		t.Fatalf("schema after up/down/up differs:\nfirst:\n%s\nsecond:\n%s", first, second)
	}
	// Up again is a no-op.
	res, err = m.Up(ctx)
	if err != nil || len(res.Applied) != 0 {
		t.Fatalf("second Up = %+v, %v; want nothing applied", res, err)
	}
}

func TestDownToEachVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, _ := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	for v := migrations.Latest() - 1; v >= 0; v-- {
		if _, err := m.Down(ctx, v); err != nil {
			t.Fatalf("Down(%d): %v", v, err)
		}
		if got, _ := m.Version(ctx); got != v {
			t.Fatalf("Version after Down(%d) = %d", v, got)
		}
	}
	if _, err := m.Down(ctx, migrations.Latest()+1); !errors.Is(err, migrations.ErrUnknownVersion) {
		t.Fatalf("Down(unknown) = %v, want ErrUnknownVersion", err)
	}
}

func TestConcurrentMigrators(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 10})
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	applied := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
			if err != nil {
				errs[i] = err
				return
			}
			res, err := m.Up(ctx)
			errs[i] = err
			if res != nil {
				applied[i] = len(res.Applied)
			}
		}()
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
		total += applied[i]
	}
	if total != migrations.Latest() {
		t.Fatalf("migrations applied %d times in all, want each once (%d)", total, migrations.Latest())
	}
	m, _ := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	if err := m.Validate(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestInjectionLookingSchemaRefused(t *testing.T) {
	t.Parallel()
	_, err := migrations.New(nil, migrations.Config{Schema: `x"; DROP TABLE y; --`})
	if err == nil || !strings.Contains(err.Error(), "invalid schema name") {
		t.Fatalf("New with injection-looking schema = %v, want invalid schema name", err)
	}
}

func TestNewerDatabaseRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, _ := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	future := migrations.Latest() + 1
	if _, err := db.Pool.Exec(ctx, `INSERT INTO "`+db.Schema+`".schema_migration (version, name, checksum) VALUES ($1, 'future', 'x')`, future); err != nil {
		t.Fatal(err)
	}
	before := schemaDump(t, db)
	for name, run := range map[string]func() error{
		"Up":   func() error { _, err := m.Up(ctx); return err },
		"Down": func() error { _, err := m.Down(ctx, 0); return err },
	} {
		if err := run(); !errors.Is(err, migrations.ErrDatabaseNewer) {
			t.Fatalf("%s on a newer database = %v, want ErrDatabaseNewer", name, err)
		}
	}
	if after := schemaDump(t, db); after != before {
		t.Fatal("refused migration changed the schema")
	}
	var verr *migrations.ValidationError
	if err := m.Validate(ctx); !errors.As(err, &verr) || len(verr.Unknown) != 1 || verr.Unknown[0] != future {
		t.Fatalf("Validate = %v, want unknown [%d]", err, future)
	}
}

func TestUnreachableDatabaseFailsFast(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A port nothing listens on: the error names it, within seconds.
	_, err := pgtest.Connect(ctx, "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", 1)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("Connect to a dead port = %v, want an error naming 127.0.0.1:1", err)
	}
}

func TestFilesExported(t *testing.T) {
	t.Parallel()
	all := migrations.All()
	if len(all) == 0 || all[0].Version != 1 || all[0].Up == "" || all[0].Down == "" {
		t.Fatalf("All() = %+v", all)
	}
	body, err := migrations.FS.ReadFile("sql/001_outbox.up.sql")
	if err != nil || !strings.Contains(string(body), "CREATE TABLE outbox_event") {
		t.Fatalf("FS 001 up: %v", err)
	}
	if strings.Contains(string(body), "millrace.") {
		t.Fatal("migration files must not be schema-qualified")
	}
}

// A database migrated by a release whose migrations 001 and 002 had other
// comments (the checksums it stored are the old text's) validates clean;
// any other stored checksum is still reported as changed.
func TestValidateAcceptsFormerChecksums(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	m, _ := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	set := func(version int, sum string) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, `UPDATE "`+db.Schema+`".schema_migration SET checksum = $2 WHERE version = $1`, version, sum); err != nil {
			t.Fatal(err)
		}
	}
	set(1, "4f61d71fb19a5f5c")
	set(2, "6cbc49f4692acf2d")
	if err := m.Validate(ctx); err != nil {
		t.Fatalf("Validate with the former checksums = %v, want nil", err)
	}
	set(2, "0000000000000000")
	var verr *migrations.ValidationError
	if err := m.Validate(ctx); !errors.As(err, &verr) || len(verr.Changed) != 1 || verr.Changed[0] != 2 {
		t.Fatalf("Validate with a foreign checksum = %v, want changed [2]", err)
	}
}

// Schemas lists the schemas that hold millrace's tables: a migrated one,
// not an empty one, nor one with only a table of the same name.
func TestSchemas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	migrated := pgtest.New(t)
	empty := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	lookalike := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	if _, err := lookalike.Pool.Exec(ctx, `CREATE SCHEMA "`+lookalike.Schema+`"; CREATE TABLE "`+lookalike.Schema+`".schema_migration (v int)`); err != nil {
		t.Fatal(err)
	}
	schemas, err := migrations.Schemas(ctx, migrated.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(schemas, migrated.Schema) || slices.Contains(schemas, empty.Schema) || slices.Contains(schemas, lookalike.Schema) {
		t.Fatalf("Schemas = %v; want %s, not %s nor %s", schemas, migrated.Schema, empty.Schema, lookalike.Schema)
	}
	if !slices.IsSorted(schemas) {
		t.Fatalf("Schemas not sorted: %v", schemas)
	}
}

// The indexes migrations 011 and 012 add to the big saga tables can be
// built beforehand with CREATE INDEX CONCURRENTLY (no write waits for
// them); the migrations then find them and go on.
func TestSagaIndexesBuiltConcurrentlyBeforehand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	m, err := migrations.New(db.Pool, migrations.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Down(ctx, 10); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE INDEX CONCURRENTLY saga_instance_status_step_idx ON "` + db.Schema + `".saga_instance (status, step, created_at DESC, id DESC)`,
		`CREATE INDEX CONCURRENTLY saga_history_stuck_idx ON "` + db.Schema + `".saga_history (saga_id) WHERE event = 'stuck' OR status = 'stuck'`,
	} {
		if _, err := db.Pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up over the indexes built beforehand: %v", err)
	}
	if err := m.Validate(ctx); err != nil {
		t.Fatal(err)
	}
}
