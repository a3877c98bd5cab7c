package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/kafka"
)

// hopRecorder notes, for each message of the saga latency phase (by UUID),
// when the relay's publish of it was acknowledged by the broker, when the
// consumer's subscriber handed it over and when the consumer acknowledged
// it (after its transaction committed); and when each saga's Start
// returned (its first command committed). From these, hops breaks a round
// trip into its hops. All times are this process's clock.
type hopRecorder struct {
	replyTopic string

	mu      sync.Mutex
	msgs    map[string]*hopMsg
	started map[string]time.Time // saga id -> Start returned
}

// hopMsg is one command or reply.
type hopMsg struct {
	sagaID, step string
	reply        bool
	published    time.Time // the broker acknowledged the relay's publish
	delivered    time.Time // the subscriber handed it to the consumer (last delivery)
	applied      time.Time // the consumer acked it: its transaction committed
}

func newHopRecorder(replyTopic string) *hopRecorder {
	return &hopRecorder{replyTopic: replyTopic, msgs: map[string]*hopMsg{}, started: map[string]time.Time{}}
}

// msg returns the entry of m; call with mu held.
func (r *hopRecorder) msg(topic string, m *message.Message) *hopMsg {
	h := r.msgs[m.UUID]
	if h == nil {
		h = &hopMsg{sagaID: m.Metadata.Get(core.MetadataSagaID), step: m.Metadata.Get(core.MetadataSagaStep), reply: topic == r.replyTopic}
		r.msgs[m.UUID] = h
	}
	return h
}

func (r *hopRecorder) start(sagaID string, at time.Time) {
	r.mu.Lock()
	r.started[sagaID] = at
	r.mu.Unlock()
}

// publisher wraps the relay's publisher.
func (r *hopRecorder) publisher(p message.Publisher) message.Publisher {
	return &hopPublisher{Publisher: p, rec: r}
}

type hopPublisher struct {
	message.Publisher
	rec *hopRecorder
}

func (p *hopPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	p.published(map[string][]*message.Message{topic: msgs}, err)
	return err
}

// PublishTopics passes the relay's calls for several topics through.
func (p *hopPublisher) PublishTopics(byTopic map[string][]*message.Message) error {
	err := publishTopics(p.Publisher, byTopic)
	p.published(byTopic, err)
	return err
}

func (p *hopPublisher) published(byTopic map[string][]*message.Message, err error) {
	now := time.Now()
	failed, ok := failedUUIDs(err)
	if !ok {
		return
	}
	p.rec.mu.Lock()
	defer p.rec.mu.Unlock()
	for topic, msgs := range byTopic {
		for _, m := range msgs {
			if h := p.rec.msg(topic, m); !failed[m.UUID] && h.published.IsZero() {
				h.published = now
			}
		}
	}
}

// subscriber wraps a consumer's subscriber; its batches pass through one
// more channel.
func (r *hopRecorder) subscriber(s *kafka.Subscriber) *hopSubscriber {
	return &hopSubscriber{Subscriber: s, rec: r}
}

type hopSubscriber struct {
	*kafka.Subscriber
	rec *hopRecorder
}

var _ core.BatchSubscriber = (*hopSubscriber)(nil)

func (s *hopSubscriber) SubscribeBatch(ctx context.Context, topic string) (<-chan *core.Batch, error) {
	in, err := s.Subscriber.SubscribeBatch(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *core.Batch)
	go func() {
		defer close(out)
		for b := range in {
			now := time.Now()
			hs := make([]*hopMsg, len(b.Messages))
			s.rec.mu.Lock()
			for i, m := range b.Messages {
				hs[i] = s.rec.msg(topic, m)
				hs[i].delivered = now
			}
			s.rec.mu.Unlock()
			go func() {
				for i, m := range b.Messages {
					select {
					case <-m.Acked():
						now := time.Now()
						s.rec.mu.Lock()
						hs[i].applied = now
						s.rec.mu.Unlock()
					case <-m.Nacked():
					case <-ctx.Done():
						return
					}
				}
			}()
			select {
			case out <- b:
			case <-ctx.Done():
				b.Nack()
				for b := range in {
					b.Nack()
				}
				return
			}
		}
	}()
	return out, nil
}

// hopNames are the hops of a round trip, in order: the saga's start
// transaction (created_at to Start returning, which commits the first
// command), then for each command and each reply: committed -> published
// (the relay's publish acknowledged by the broker), -> delivered (the
// consumer's subscriber hands it over), -> applied (the consumer's
// transaction committed, which also commits the next message).
var hopNames = []string{
	"start", "command_relay", "command_fetch", "participant_apply", "reply_relay", "reply_fetch", "orchestrator_apply",
}

// hops computes the hops of the completed sagas of the latency phase and
// returns, per hop, the sorted durations over all three steps; perStep
// holds the same per step name.
func (r *hopRecorder) hops(ctx context.Context, rig *sagaRig, steps []string) (all map[string][]time.Duration, perStep map[string]map[string][]time.Duration, n int, err error) {
	inst := sqlident.Table(rig.schema, "saga_instance")
	rows, err := rig.pool.Query(ctx, `SELECT id, created_at FROM `+inst+` WHERE status = 'completed' AND id LIKE 'l-%'`)
	if err != nil {
		return nil, nil, 0, err
	}
	created := map[string]time.Time{}
	for rows.Next() {
		var id string
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			rows.Close()
			return nil, nil, 0, err
		}
		created[id] = at
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	type key struct {
		saga, step string
		reply      bool
	}
	byKey := map[key]*hopMsg{}
	for _, h := range r.msgs {
		byKey[key{h.sagaID, h.step, h.reply}] = h
	}
	all = map[string][]time.Duration{}
	perStep = map[string]map[string][]time.Duration{}
	for _, s := range steps {
		perStep[s] = map[string][]time.Duration{}
	}
	add := func(step, hop string, from, to time.Time) {
		d := max(to.Sub(from), 0) // a relay can publish before the committer hears its commit returned
		all[hop] = append(all[hop], d)
		perStep[step][hop] = append(perStep[step][hop], d)
	}
sagas:
	for id, c := range created {
		st, ok := r.started[id]
		if !ok {
			continue
		}
		var chain []*hopMsg
		for _, s := range steps {
			cmd, rep := byKey[key{id, s, false}], byKey[key{id, s, true}]
			if cmd == nil || rep == nil {
				continue sagas
			}
			for _, h := range []*hopMsg{cmd, rep} {
				if h.published.IsZero() || h.delivered.IsZero() || h.applied.IsZero() {
					continue sagas
				}
			}
			chain = append(chain, cmd, rep)
		}
		n++
		add(steps[0], "start", c, st)
		committed := st
		for i, h := range chain {
			step := steps[i/2]
			relay, fetch, apply := "command_relay", "command_fetch", "participant_apply"
			if h.reply {
				relay, fetch, apply = "reply_relay", "reply_fetch", "orchestrator_apply"
			}
			add(step, relay, committed, h.published)
			add(step, fetch, h.published, h.delivered)
			add(step, apply, h.delivered, h.applied)
			committed = h.applied
		}
	}
	for _, ds := range all {
		slices.Sort(ds)
	}
	for _, m := range perStep {
		for _, ds := range m {
			slices.Sort(ds)
		}
	}
	if n == 0 {
		return nil, nil, 0, fmt.Errorf("no saga of the latency phase has all its hops recorded (%d messages seen)", len(r.msgs))
	}
	return all, perStep, n, nil
}
