package sagatest

import (
	"sync"
	"time"
)

// defaultStart is the time a harness's Clock starts at, unless
// Config.Start says otherwise: fixed, so that runs repeat exactly.
var defaultStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a saga.Config.Clock that moves only when told to. The harness moves it
// to the next due timer whenever nothing else can happen, so a one-hour
// timeout costs no wall-clock time. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// newClock returns a Clock showing start.
func newClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (a negative d is ignored: time
// never goes back).
func (c *Clock) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// set moves the clock to t if t is later.
func (c *Clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
}
