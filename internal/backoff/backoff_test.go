package backoff

import (
	"context"
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		attempt int
		want    time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {4, 8 * time.Second}, {7, 60 * time.Second}, {1000, 60 * time.Second}} {
		if got := Exponential(c.attempt, time.Second, time.Minute); got != c.want {
			t.Errorf("Exponential(%d) = %v, want %v", c.attempt, got, c.want)
		}
	}
}

func TestSleepCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep on a cancelled context reported a full sleep")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("short Sleep did not complete")
	}
}
