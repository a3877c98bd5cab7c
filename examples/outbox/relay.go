package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// relay is one running outbox.Relay with its Kafka publisher.
type relay struct {
	name     string
	counter  *countingPublisher
	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
}

// startRelay starts a relay that ships the outbox to Kafka until stopped.
func startRelay(e *env, name string) (*relay, error) {
	// kafka.Publisher sends each claimed batch in one produce call, with
	// sarama's idempotent producer and acks from all in-sync replicas.
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: e.brokers}, e.logger)
	if err != nil {
		return nil, err
	}
	counter := &countingPublisher{Publisher: pub}
	r, err := outbox.NewRelay(e.pool, outbox.RelayConfig{
		Schema:    e.schema,
		Publisher: counter,
		Logger:    e.logger,
	})
	if err != nil {
		_ = pub.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	rl := &relay{name: name, counter: counter, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rl.done)
		_ = r.Run(ctx) // returns when ctx ends, after the batches in flight
	}()
	return rl, nil
}

// stop stops the relay gracefully: Run finishes its batches in flight
// (published and marked, so no duplicates), and the lanes it held are
// free for the other relay. Stopping twice is a no-op.
func (r *relay) stop() {
	r.stopOnce.Do(func() {
		r.cancel()
		<-r.done
		_ = r.counter.Close()
	})
}

// published is how many events this relay got acknowledged by Kafka.
func (r *relay) published() int64 { return r.counter.n.Load() }

// countingPublisher counts the messages that its Publisher delivered. It
// passes errors through unchanged: the relay needs the *core.BatchError
// to know which messages failed.
type countingPublisher struct {
	message.Publisher
	n atomic.Int64
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	failed := 0
	var be *core.BatchError
	switch {
	case errors.As(err, &be):
		failed = len(be.Errors)
	case err != nil:
		failed = len(msgs)
	}
	p.n.Add(int64(len(msgs) - failed))
	return err
}
