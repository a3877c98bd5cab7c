package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
)

// A schema without millrace's tables: the command says which schema it
// looked in and which schemas hold millrace tables, not a raw SQL error.
func TestMissingTablesNamesTheSchemas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"--database-url", pgtest.URL(), "--schema", "no_millrace_here", "saga", "list"}, &stdout, &stderr, func(string) string { return "" })
	msg := stderr.String()
	if code != exitFail || !strings.HasPrefix(msg, `millrace: schema "no_millrace_here" has no millrace tables`) ||
		!strings.Contains(msg, "pass --schema") || strings.Contains(msg, "SQLSTATE") {
		t.Fatalf("exit %d, stderr %q", code, msg)
	}
	if !strings.Contains(msg, db.Schema) && !strings.Contains(msg, " more; pass --schema") {
		t.Errorf("stderr %q lists neither %s nor says there are more", msg, db.Schema)
	}
}

// Listings take --schema repeatedly, or --all-schemas: each schema's
// result under its name, in the table and as a JSON array; a command that
// acts refuses several schemas.
func TestListingsOverSeveralSchemas(t *testing.T) {
	t.Parallel()
	a, b := pgtest.New(t), pgtest.New(t)
	opstest.OutboxDead(t, b, "orders", 2)
	out := ok(t, a, "--schema", b.Schema, "outbox", "stats", "--json")
	var got []struct {
		Schema string
		Result struct{ Dead int64 }
		Error  string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%v in %s", err, out)
	}
	if len(got) != 2 || got[0].Schema != a.Schema || got[1].Schema != b.Schema || got[0].Result.Dead != 0 || got[1].Result.Dead != 2 {
		t.Fatalf("outbox stats over two schemas: %+v", got)
	}
	out = ok(t, a, "--schema", b.Schema, "migrate", "status")
	if !strings.Contains(out, "== schema "+a.Schema+"\n") || !strings.Contains(out, "== schema "+b.Schema+"\n") {
		t.Fatalf("migrate status over two schemas:\n%s", out)
	}

	// --all-schemas: every schema holding millrace's tables, both of these.
	// (Other tests' schemas share the database, some half migrated or being
	// dropped: those may fail, and the exit status with them.)
	var stdout, stderr strings.Builder
	code := run(context.Background(), []string{"--database-url", pgtest.URL(), "--all-schemas", "saga", "list", "--json"}, &stdout, &stderr, func(string) string { return "" })
	var all []struct {
		Schema string
		Result json.RawMessage
		Error  string
	}
	if err := json.Unmarshal([]byte(stdout.String()), &all); err != nil || code > exitFail {
		t.Fatalf("saga list --all-schemas: exit %d, %v %s\n%s", code, err, stderr.String(), stdout.String())
	}
	found := 0
	for _, o := range all {
		if (o.Schema == a.Schema || o.Schema == b.Schema) && o.Error == "" && len(o.Result) > 0 {
			found++
		}
	}
	if found != 2 {
		t.Fatalf("saga list --all-schemas lists %d of the two schemas:\n%s", found, stdout.String())
	}

	// A schema without millrace's tables fails on its own line; the others
	// are listed; the command fails.
	r := cli(t, a, "--schema", "no_millrace_here", "outbox", "stats")
	if r.code != exitFail || !strings.Contains(r.stdout, "== schema no_millrace_here\nerror: ") || !strings.Contains(r.stdout, "== schema "+a.Schema) {
		t.Fatalf("listing with a bad schema: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	fails(t, a, exitUsage, "works on one schema: pass --schema once", "--schema", b.Schema, "outbox", "dead", "requeue", "x")
	fails(t, a, exitUsage, "--all-schemas is for listings", "--all-schemas", "outbox", "replay", "--all")
}
