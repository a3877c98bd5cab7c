package outbox

// Lane is lane, for the tests: the lane the Writer gives a partition key.
func Lane(partitionKey string) int16 { return lane(partitionKey) }
