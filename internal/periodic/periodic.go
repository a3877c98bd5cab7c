// Package periodic runs a job at a fixed interval: the loop that millrace's
// Cleaners share.
package periodic

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
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

// Clean runs a Cleaner's passes with Run: clean every interval, its
// errors logged as failed (with how many it removed before failing) and
// tried again at the next interval, a pass that removed something logged
// as done with the count and the time it took. It returns nil when ctx
// ends.
func Clean[N int | int64](ctx context.Context, interval time.Duration, logger watermill.LoggerAdapter, failed, done string, clean func(context.Context) (N, error)) error {
	Run(ctx, interval, func(ctx context.Context) {
		start := time.Now()
		n, err := clean(ctx)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			logger.Error(failed, err, watermill.LogFields{"deleted": n})
		case n > 0:
			logger.Info(done, watermill.LogFields{"deleted": n, "took": time.Since(start).String()})
		}
	})
	return nil
}
