// Package backoff computes capped exponential delays and sleeps on them.
package backoff

import (
	"context"
	"time"
)

// Exponential returns min·2^(attempt-1), capped at max. attempt counts from 1;
// values below 1 are treated as 1.
func Exponential(attempt int, min, max time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := min
	for i := 1; i < attempt; i++ {
		d *= 2
		if d >= max || d <= 0 {
			return max
		}
	}
	return d
}

// Sleep waits for d or until ctx ends, and reports whether it slept the
// whole time.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
