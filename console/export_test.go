package console

// SetBulkInRequest sets the largest bulk operation c's confirmation files
// before it answers, for tests. Call it before c serves.
func SetBulkInRequest(c *Console, n int64) { c.bulkInRequest = n }
