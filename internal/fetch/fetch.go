// Package fetch reads topics as runs of messages for the batched consumers
// (saga.RunBatched, compensation.Participant.RunBatched): whole fetches of
// a partition from a core.BatchSubscriber, one message at a time from any
// other message.Subscriber, and gathers them into transaction batches that
// close as soon as nothing more is ready.
package fetch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
)

// Run is consecutive messages of one partition of Topic, in order (from a
// plain message.Subscriber: one message).
type Run struct {
	Topic string
	Msgs  []*message.Message
	// Batched is true when the run comes from a core.BatchSubscriber: a
	// nacked message there is delivered again with every message after it
	// in its partition, so those need not be tried.
	Batched bool
}

// Subscribe subscribes to each topic, with SubscribeBatch when sub is a
// core.BatchSubscriber, and sends the runs to the returned channel until
// ctx ends or every subscription has ended, then closes it. batched tells
// which interface was used; wait waits for the forwarding goroutines and
// nacks what no batch took; call it after the batches' workers have
// returned.
func Subscribe(ctx context.Context, sub message.Subscriber, topics []string) (out <-chan Run, batched bool, wait func(), err error) {
	bs, batched := sub.(core.BatchSubscriber)
	// Buffered: the runs the partitions have ready wait here, so a batch
	// that takes what is ready sees them all, not only the one a
	// forwarding goroutine holds.
	ch := make(chan Run, 256)
	var wg sync.WaitGroup
	for _, topic := range topics {
		if batched {
			in, err := bs.SubscribeBatch(ctx, topic)
			if err != nil {
				return nil, false, nil, fmt.Errorf("subscribe to %s: %w", topic, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for b := range in {
					select {
					case ch <- Run{Topic: topic, Msgs: b.Messages, Batched: true}:
					case <-ctx.Done():
						b.Nack()
						return
					}
				}
			}()
			continue
		}
		in, err := sub.Subscribe(ctx, topic)
		if err != nil {
			return nil, false, nil, fmt.Errorf("subscribe to %s: %w", topic, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range in {
				select {
				case ch <- Run{Topic: topic, Msgs: []*message.Message{m}}:
				case <-ctx.Done():
					m.Nack()
					return
				}
			}
		}()
	}
	// The channel closes once every subscription has ended: when ctx
	// ends, or when the subscriber closed them on its own (the consumers
	// then stop, and say so).
	closed := make(chan struct{})
	go func() {
		wg.Wait()
		close(ch)
		close(closed)
	}()
	wait = func() {
		<-closed
		for r := range ch {
			for _, m := range r.Msgs {
				m.Nack()
			}
		}
	}
	return ch, batched, wait, nil
}

// Gatherer builds transaction batches from runs; one per worker.
type Gatherer struct {
	In <-chan Run
	// Max is the most messages in a batch; a longer run is split, its
	// rest starting the next batch.
	Max int
	// Wait is how long a batch waits for more after its first run; 0
	// closes it as soon as nothing more is ready.
	Wait    time.Duration
	pending *Run
}

// Next blocks for a first run, then takes what is ready (or arrives within
// Wait) up to Max messages. It returns nil when ctx ends or In closes with
// nothing gathered.
func (g *Gatherer) Next(ctx context.Context) []Run {
	var out []Run
	n := 0
	add := func(r Run) {
		if room := g.Max - n; len(r.Msgs) > room {
			rest := Run{Topic: r.Topic, Msgs: r.Msgs[room:], Batched: r.Batched}
			g.pending = &rest
			r.Msgs = r.Msgs[:room:room]
		}
		out = append(out, r)
		n += len(r.Msgs)
	}
	if g.pending != nil {
		r := *g.pending
		g.pending = nil
		add(r)
	} else {
		select {
		case r, ok := <-g.In:
			if !ok {
				return nil
			}
			add(r)
		case <-ctx.Done():
			return nil
		}
	}
	var timeout <-chan time.Time
	if g.Wait > 0 {
		t := time.NewTimer(g.Wait)
		defer t.Stop()
		timeout = t.C
	}
	for n < g.Max && g.pending == nil {
		if timeout == nil {
			select {
			case r, ok := <-g.In:
				if !ok {
					return out
				}
				add(r)
				continue
			default:
				return out
			}
		}
		select {
		case r, ok := <-g.In:
			if !ok {
				return out
			}
			add(r)
		case <-timeout:
			return out
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// Messages returns the messages of runs in order.
func Messages(runs []Run) []*message.Message {
	var n int
	for _, r := range runs {
		n += len(r.Msgs)
	}
	out := make([]*message.Message, 0, n)
	for _, r := range runs {
		out = append(out, r.Msgs...)
	}
	return out
}

// NackAll nacks every message of runs, and the rest of a run that Next
// split (it must not be applied ahead of the nacked part).
func (g *Gatherer) NackAll(runs []Run) {
	for _, r := range runs {
		for _, m := range r.Msgs {
			m.Nack()
		}
	}
	g.dropPending()
}

func (g *Gatherer) dropPending() {
	if g.pending == nil {
		return
	}
	for _, m := range g.pending.Msgs {
		m.Nack()
	}
	g.pending = nil
}

// EachAlone calls try for each message of runs (the last batch Next
// returned) in order, for the fallback of a failed batch: a message try
// fails is nacked, and in a batched run so is every message after it,
// with the rest of the run Next split off (the partition delivers them
// again from the nacked one, so they are not tried). It returns the number
// try applied.
func (g *Gatherer) EachAlone(ctx context.Context, runs []Run, try func(topic string, m *message.Message) bool) int {
	applied := 0
	for i, r := range runs {
		failed := false
		for _, m := range r.Msgs {
			if failed || ctx.Err() != nil {
				m.Nack()
				failed = true
				continue
			}
			if try(r.Topic, m) {
				applied++
				continue
			}
			m.Nack()
			failed = r.Batched
		}
		if failed && i == len(runs)-1 {
			g.dropPending()
		}
	}
	return applied
}
