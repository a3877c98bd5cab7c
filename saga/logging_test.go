package saga_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/internal/pgtest"
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

// With no Logger, the orchestrator's and the compensation Cleaner's errors
// go to slog.Default(), as the relay's do. Not parallel: it replaces
// slog's default logger (parallel tests start after it ends).
func TestNoLoggerLogsErrorsToSlogDefault(t *testing.T) {
	var buf lockedBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true}) // no tables: every pass fails
	o, err := saga.New(db.Pool, saga.Config{Schema: db.Schema, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := compensation.NewCleaner(db.Pool, compensation.CleanerConfig{Schema: db.Schema, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = o.Run(ctx) }()
	go func() { defer wg.Done(); _ = c.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := buf.String()
		if strings.Contains(out, "level=ERROR") && strings.Contains(out, "saga: timers") &&
			strings.Contains(out, "compensation.Cleaner") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no errors of the orchestrator and the cleaner on slog.Default() within 30s; got:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
