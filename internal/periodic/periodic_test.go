package periodic_test

import (
	"context"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/periodic"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

func TestRunPassesAtOnceThenEveryIntervalUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	passes := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		periodic.Run(ctx, time.Millisecond, func(context.Context) {
			passes++
			if passes == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its context ended")
	}
	if passes != 3 {
		t.Fatalf("passes = %d, want 3", passes)
	}
}

func TestRunReturnsAtOnceForAnEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	periodic.Run(ctx, time.Hour, func(context.Context) { called = true })
	if called {
		t.Fatal("a pass ran for a context that had ended")
	}
}
