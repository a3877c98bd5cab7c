package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millrace/millrace/inbox"
)

const (
	inboxCallers = 4
	inboxBatch   = 100 // messages per Receive call
)

// benchInbox measures inbox_accept_events_per_s: messages stored per second
// by the store-then-process Receiver, 4 callers each storing batches of
// inboxBatch messages with Receive (one statement per batch). No processor
// runs: this is how fast a burst is taken off the broker.
func (b *bench) benchInbox(ctx context.Context) error {
	pool, schema, done, err := b.workspace(ctx, inboxCallers+1)
	if err != nil {
		return err
	}
	defer done()
	rcv, err := inbox.NewReceiver(pool, inbox.ReceiverConfig{Schema: schema, Consumer: "bench"})
	if err != nil {
		return err
	}
	b.progress("inbox: %d callers storing batches of %d for %s", inboxCallers, inboxBatch, b.opts.duration)
	accepted, elapsed, err := forEach(ctx, inboxCallers, b.opts.duration, func(ctx context.Context, _ int) (int, error) {
		msgs := make([]*message.Message, inboxBatch)
		for i := range msgs {
			msgs[i] = messageOf(uuid.Must(uuid.NewV7()).String(), rand.IntN(1<<20))
		}
		n, err := rcv.Receive(ctx, msgs...)
		if err == nil && n != len(msgs) {
			err = fmt.Errorf("stored %d of %d new messages", n, len(msgs))
		}
		return n, err
	})
	if err != nil {
		return err
	}
	rate := float64(accepted) / elapsed.Seconds()
	b.results["inbox_accept_events_per_s"] = round(rate, 0)
	b.config["inbox_callers"], b.config["inbox_batch"] = inboxCallers, inboxBatch
	b.progress("inbox: %d messages in %s = %.0f/s", accepted, elapsed.Round(1e6), rate)
	return nil
}
