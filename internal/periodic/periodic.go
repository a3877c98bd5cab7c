// Package periodic runs a job at a fixed interval: the loop of the
// retention Cleaner.
package periodic

import (
	"context"
	"time"
)

// Run calls pass at once and then every interval, measured from the end of
// one pass to the start of the next, until ctx ends. A pass gets ctx and
// should return when it ends.
func Run(ctx context.Context, interval time.Duration, pass func(context.Context)) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if ctx.Err() != nil { // both were ready: select chose at random
			return
		}
		pass(ctx)
		timer.Reset(interval)
	}
}
