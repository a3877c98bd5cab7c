package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// On a schema without the saga tables (a typo, migrations not applied)
// Run fails at once, and Start fails, saying so.
func TestRunAndStartSayTheTablesAreMissing(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 4})
	const schema = "no_such_saga_schema"
	o, err := saga.New(db.Pool, saga.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	def := mustDefine(t, orderSpec(&testBundle{tbl: func(string) string { return "unused" }}, 1))
	if err := o.Register(def); err != nil {
		t.Fatal(err)
	}
	want := `saga tables missing in schema "no_such_saga_schema": migrations applied?`
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := o.Run(ctx); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Run: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Run returned only when its context ended")
	}
	if _, err := saga.Start(context.Background(), o, def, "o-1", order{ID: "o-1"}); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Start: %v", err)
	}
}
