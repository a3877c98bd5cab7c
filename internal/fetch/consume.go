package fetch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/internal/backoff"
)

// Apply applies msgs in one transaction of its own. An error means nothing
// was applied; otherwise poisoned[i], if not nil, is the permanent error of
// msgs[i], which was not applied and goes to the poison topic.
type Apply func(ctx context.Context, msgs []*message.Message) (poisoned []error, err error)

// Consumer is a batched consumer's settings (saga.Orchestrator.RunBatched,
// compensation.Participant.RunBatched).
type Consumer struct {
	// What names the consumer in its errors and logs ("saga: reply").
	What string
	// Max is the most messages a batch takes; Wait how long a batch waits
	// for more after its first, from a subscriber of one message at a
	// time (a batch subscriber's fetch closes its batch when drained).
	Max  int
	Wait time.Duration
	// Workers is the number of batches in flight at once.
	Workers int
	// Poison receives the poisoned messages on PoisonTopic, or the
	// message's topic + ".poison" when it is empty, with the reason in
	// metadata "reason_poisoned" and the topic in "topic_poisoned".
	Poison      message.Publisher
	PoisonTopic string
	Logger      watermill.LoggerAdapter
	// OnBatch, if set, is called with the size of each batch before it is
	// applied (a metric).
	OnBatch func(n int)
}

// Run consumes topics from sub and applies them with apply, batch after
// batch, until ctx ends. A batch that fails rolls back whole and its
// messages are applied again one per transaction, so that one that cannot
// be applied holds up no other: the failing ones are nacked (from a batch
// subscriber, with what follows them in their partition, which comes again
// in order) and the others acknowledged. When nothing could be applied
// (the database is likely away), the next try waits, backing off up to a
// second. Run returns an error when the subscriptions end before ctx.
func (c Consumer) Run(ctx context.Context, sub message.Subscriber, topics []string, apply Apply) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, batched, waitSubs, err := Subscribe(ctx, sub, topics)
	if err != nil {
		return fmt.Errorf("%s: %w", c.What, err)
	}
	wait := c.Wait
	if batched {
		wait = 0 // a fetch is all there is: close the batch when it is drained
	}
	var wg sync.WaitGroup
	for range c.Workers {
		wg.Go(func() { c.work(ctx, &Gatherer{In: in, Max: c.Max, Wait: wait}, apply) })
	}
	wg.Wait() // until ctx ends, or the subscriptions do
	waitSubs()
	if ctx.Err() == nil {
		return fmt.Errorf("%s: the subscription to %v ended", c.What, topics)
	}
	return nil
}

// work applies the batches g gathers until it gathers none.
func (c Consumer) work(ctx context.Context, g *Gatherer, apply Apply) {
	failures := 0
	for {
		runs := g.Next(ctx)
		if runs == nil {
			return
		}
		msgs := Messages(runs)
		if c.OnBatch != nil {
			c.OnBatch(len(msgs))
		}
		poisoned, err := apply(ctx, msgs)
		if err == nil {
			failures = 0
			i := 0
			for _, r := range runs {
				for _, m := range r.Msgs {
					c.settle(r.Topic, m, poisoned[i])
					i++
				}
			}
			continue
		}
		if ctx.Err() == nil {
			c.Logger.Error(c.What+" batch", err, watermill.LogFields{"messages": len(msgs)})
		}
		applied := 0
		if len(msgs) == 1 {
			g.NackAll(runs)
		} else {
			// One each, in a transaction of its own, for its own result.
			applied = g.EachAlone(ctx, runs, func(topic string, m *message.Message) bool {
				poisoned, err := apply(ctx, []*message.Message{m})
				if err != nil {
					if ctx.Err() == nil {
						c.Logger.Error(c.What, err, watermill.LogFields{"message": m.UUID})
					}
					return false
				}
				c.settle(topic, m, poisoned[0])
				return true
			})
		}
		if applied > 0 {
			failures = 0
			continue
		}
		failures++
		backoff.Sleep(ctx, backoff.Exponential(failures, 10*time.Millisecond, time.Second))
	}
}

// settle acknowledges a handled message, once its poison copy (for a
// poisoned one) is published; a poison copy that cannot be published nacks
// it.
func (c Consumer) settle(topic string, msg *message.Message, poisoned error) {
	if poisoned != nil {
		ptopic := c.PoisonTopic
		if ptopic == "" {
			ptopic = topic + ".poison"
		}
		p := msg.Copy()
		p.Metadata.Set(middleware.ReasonForPoisonedKey, poisoned.Error())
		p.Metadata.Set(middleware.PoisonedTopicKey, topic) // where a requeue sends it back
		if err := c.Poison.Publish(ptopic, p); err != nil {
			c.Logger.Error(c.What+": poison a message", err, watermill.LogFields{"message": msg.UUID})
			msg.Nack()
			return
		}
	}
	msg.Ack()
}
