package saga

import "time"

// SetCleanerAfterBatch makes c call f after each batch with the number of
// sagas it removed and the time its statement took.
func SetCleanerAfterBatch(c *Cleaner, f func(deleted int, took time.Duration)) { c.afterBatch = f }
