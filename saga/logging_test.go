package saga_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// lockedBuffer is a bytes.Buffer for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With no Logger, the orchestrator's errors go to slog.Default(), as the
// relay's do. Not parallel: it replaces slog's default logger (parallel
// tests start after it ends).
func TestNoLoggerLogsErrorsToSlogDefault(t *testing.T) {
	var buf lockedBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	// Run fails at start on a schema without tables (and returns that), so
	// the tables go once the orchestrator's timer passes are under way:
	// every pass fails after that.
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema, Writer: w, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Register(mustDefine(t, plainSpec(1))); err != nil { // timers claim registered types only
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = o.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	scans := func() int64 {
		var n int64
		_ = db.Pool.QueryRow(ctx, `SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'saga_instance'`, db.Schema).Scan(&n)
		return n
	}
	for start := time.Now(); scans() < 5; time.Sleep(20 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the orchestrator's timer passes did not start within 30s")
		}
	}
	if _, err := db.Pool.Exec(ctx, `DROP TABLE "`+db.Schema+`".saga_instance CASCADE`); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := buf.String()
		if strings.Contains(out, "level=ERROR") && strings.Contains(out, "saga: timers") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no errors of the orchestrator on slog.Default() within 30s; got:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
