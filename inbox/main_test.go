package inbox_test

import (
	"github.com/millrace/millrace/core"

	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// bundle is one test's schema with an effect table: the handlers under test
// insert one row per application of an event, without a unique key, so a
// double application shows as two rows.
type bundle struct {
	db     *pgtest.DB
	effect string // quoted schema.effect
}

func setup(t testing.TB, maxConns int32) *bundle {
	t.Helper()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: maxConns})
	b := &bundle{db: db, effect: sqlident.Table(db.Schema, "effect")}
	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+b.effect+` (event_id text NOT NULL, note text NOT NULL DEFAULT '')`); err != nil {
		t.Fatal(err)
	}
	return b
}

// apply is a handler body: one effect row for the event in tx.
func (b *bundle) apply(ctx context.Context, tx pgx.Tx, eventID, note string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+b.effect+` (event_id, note) VALUES ($1, $2)`, eventID, note)
	return err
}

func (b *bundle) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := b.db.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (b *bundle) effects(t testing.TB) int {
	return b.count(t, `SELECT count(*) FROM `+b.effect)
}

func (b *bundle) distinctEffects(t testing.TB) int {
	return b.count(t, `SELECT count(DISTINCT event_id) FROM `+b.effect)
}

func (b *bundle) table(name string) string { return sqlident.Table(b.db.Schema, name) }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// opsActor is who the tests' operator actions are recorded as.
var opsActor = core.Actor{Operator: "ops", Reason: "test"}
