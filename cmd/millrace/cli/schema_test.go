package cli

import (
	"context"
	"strings"
	"testing"

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
