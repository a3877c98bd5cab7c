package core

import "time"

// Defaults of the batched consumers: the orchestrator's replies
// (saga.BatchConfig) and a participant's commands (compensation.RunConfig).
const (
	// DefaultBatchSize is the most messages a batched consumer applies in
	// one transaction.
	DefaultBatchSize = 500
	// DefaultBatchWait is how long a batch waits for more messages after
	// its first, from a subscriber that delivers one message at a time (a
	// BatchSubscriber's fetch closes its batch when drained).
	DefaultBatchWait = time.Millisecond
)
