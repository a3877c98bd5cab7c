package core

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// BatchSubscriber is the optional ability of a message.Subscriber to
// deliver many messages of a partition at once; kafka.Subscriber has it.
// The batched consumers (saga.Orchestrator.RunBatched,
// compensation.Participant.RunBatched) look for it by type assertion and
// then take whole fetches per transaction.
//
// They rely on what an implementation promises: a partition's messages
// come in order, one Batch of a partition in flight at a time, and once
// every message of a Batch is acked or nacked, the partition goes on from
// its first nacked message, delivering it again with every message after
// it, acked or not. So a consumer need not try the messages after one
// that failed.
type BatchSubscriber interface {
	SubscribeBatch(ctx context.Context, topic string) (<-chan *Batch, error)
}

// Batch is a run of consecutive messages of one partition, in order, as a
// BatchSubscriber delivers it. Ack and Nack act on all its messages; each
// message can also be acked or nacked alone.
type Batch struct {
	// Topic and Partition are where the messages come from.
	Topic     string
	Partition int32
	// Messages are the messages, in partition order.
	Messages []*message.Message
}

// Ack acks every message of the batch that was not nacked.
func (b *Batch) Ack() {
	for _, m := range b.Messages {
		m.Ack()
	}
}

// Nack nacks every message of the batch that was not acked: the partition
// is delivered again from the first of them.
func (b *Batch) Nack() {
	for _, m := range b.Messages {
		m.Nack()
	}
}

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
