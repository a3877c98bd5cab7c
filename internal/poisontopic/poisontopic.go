// Package poisontopic reads and requeues a Kafka poison topic (the dead
// letters a Watermill PoisonQueue writes), one by one or in bulk by a
// query, for the millrace command and the console. It is internal, beside
// them, rather than in package kafka: it is their tool, not a library API,
// and keeps package kafka's surface small. Package poison, which saga and
// compensation use, stays free of Kafka.
package poisontopic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/internal/bulk"
	"github.com/millrace/millrace/kafka"
)

// Message is one poisoned message, as read back from its poison topic.
type Message struct {
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Time      time.Time `json:"time"`
	// UUID is the Watermill message's UUID.
	UUID string `json:"uuid"`
	// Reason is why it was poisoned (metadata "reason_poisoned").
	Reason string `json:"reason"`
	// Topic is the topic it was consumed from (metadata "topic_poisoned"),
	// where Requeue sends it back.
	Topic string `json:"topic"`
	// Handler is the Router handler that poisoned it.
	Handler string `json:"handler,omitempty"`
	// Metadata holds its original metadata, without the poison keys.
	Metadata map[string]string `json:"metadata"`
	Payload  string            `json:"payload"`
	msg      *message.Message
}

// poisonKeys are the metadata keys PoisonQueue adds.
var poisonKeys = []string{middleware.ReasonForPoisonedKey, middleware.PoisonedTopicKey,
	middleware.PoisonedHandlerKey, middleware.PoisonedSubscriberKey}

// Read returns the number of messages on topic and up to limit of them,
// newest first (limit <= 0: all). It reads every partition from its start
// to its end at the time of the call and does not join a consumer group.
func Read(ctx context.Context, brokers []string, topic string, limit int) (total int, msgs []Message, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DialTimeout(10*time.Second))
	if err != nil {
		return 0, nil, fmt.Errorf("poison: kafka client: %w", err)
	}
	defer cl.Close()
	start, end, err := offsets(ctx, cl, topic)
	if err != nil {
		return 0, nil, err
	}
	parts := map[int32]kgo.Offset{}
	for p, e := range end {
		total += int(e - start[p])
		if e > start[p] {
			parts[p] = kgo.NewOffset().At(start[p])
		}
	}
	if total == 0 {
		return 0, nil, nil
	}
	cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts})
	unmarshal := kafka.DefaultUnmarshaler()
	pos := map[int32]int64{}
	for p := range parts {
		pos[p] = start[p]
	}
	done := func() bool {
		for p, o := range pos {
			if o < end[p] {
				return false
			}
		}
		return true
	}
	for !done() {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) { ferr = errors.Join(ferr, err) })
		if ferr != nil {
			return 0, nil, fmt.Errorf("poison: read %s: %w", topic, ferr)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end[r.Partition] {
				return
			}
			pos[r.Partition] = r.Offset + 1
			m, err := decode(unmarshal, r)
			if err != nil {
				m = Message{Reason: "(not a Watermill message: " + err.Error() + ")", Payload: string(r.Value)}
			}
			m.Partition, m.Offset, m.Time = r.Partition, r.Offset, r.Timestamp
			msgs = append(msgs, m)
		})
	}
	slices.SortFunc(msgs, func(a, b Message) int {
		if c := b.Time.Compare(a.Time); c != 0 {
			return c
		}
		return int(b.Offset - a.Offset)
	})
	if limit > 0 && len(msgs) > limit {
		msgs = msgs[:limit]
	}
	return total, msgs, nil
}

func decode(u kafka.Unmarshaler, r *kgo.Record) (Message, error) {
	wm, err := u.Unmarshal(r)
	if err != nil {
		return Message{}, err
	}
	m := Message{UUID: wm.UUID, Reason: wm.Metadata.Get(middleware.ReasonForPoisonedKey),
		Topic: wm.Metadata.Get(middleware.PoisonedTopicKey), Handler: wm.Metadata.Get(middleware.PoisonedHandlerKey),
		Metadata: map[string]string{}, Payload: string(wm.Payload), msg: wm}
	for k, v := range wm.Metadata {
		if !slices.Contains(poisonKeys, k) {
			m.Metadata[k] = v
		}
	}
	return m, nil
}

// offsets returns the start and end offset of each partition of topic.
func offsets(ctx context.Context, cl *kgo.Client, topic string) (start, end map[int32]int64, err error) {
	mreq := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	mreq.Topics = append(mreq.Topics, t)
	mresp, err := mreq.RequestWith(ctx, cl)
	if err != nil {
		return nil, nil, fmt.Errorf("poison: kafka metadata: %w", err)
	}
	if len(mresp.Topics) != 1 {
		return nil, nil, fmt.Errorf("poison: kafka metadata: %d topics for %q", len(mresp.Topics), topic)
	}
	if code := mresp.Topics[0].ErrorCode; code != 0 {
		return nil, nil, fmt.Errorf("poison: topic %q: %w", topic, kerr.ErrorForCode(code))
	}
	start, end = map[int32]int64{}, map[int32]int64{}
	for _, ts := range []int64{-2, -1} { // earliest, latest
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = topic
		for _, p := range mresp.Topics[0].Partitions {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition, rp.Timestamp = p.Partition, ts
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return nil, nil, fmt.Errorf("poison: list offsets of %q: %w", topic, err)
		}
		for _, rt := range resp.Topics {
			for _, p := range rt.Partitions {
				if p.ErrorCode != 0 {
					return nil, nil, fmt.Errorf("poison: offsets of %q partition %d: %w", topic, p.Partition, kerr.ErrorForCode(p.ErrorCode))
				}
				if ts == -2 {
					start[p.Partition] = p.Offset
				} else {
					end[p.Partition] = p.Offset
				}
			}
		}
	}
	return start, end, nil
}

// Requeue publishes the messages of topic whose UUID is in ids (all of
// them when ids is empty) back to the topic they were poisoned from, with
// their payload and original metadata, and returns how many it sent. The
// poison topic keeps them (Kafka deletes nothing): requeue a message once.
func Requeue(ctx context.Context, brokers []string, topic string, ids []string) (int, error) {
	_, msgs, err := Read(ctx, brokers, topic, 0)
	if err != nil {
		return 0, err
	}
	var pick []Message
	found := map[string]bool{}
	for _, m := range msgs {
		if len(ids) > 0 && !slices.Contains(ids, m.UUID) {
			continue
		}
		if m.msg == nil || m.Topic == "" {
			return 0, fmt.Errorf("poison: message at partition %d offset %d of %s does not say its original topic", m.Partition, m.Offset, topic)
		}
		found[m.UUID] = true
		pick = append(pick, m)
	}
	for _, id := range ids {
		if !found[id] {
			return 0, fmt.Errorf("poison: no message %s on %s", id, topic)
		}
	}
	return send(brokers, pick)
}

// Query selects the messages of a poison topic for a bulk requeue
// (DryRunMatching, RequeueMatching). Every condition set must hold; the
// zero value selects every message.
type Query struct {
	// Reason keeps only messages whose reason matches this SQL LIKE
	// pattern ("%unknown command%": % any run of characters, _ any one, \
	// makes the next literal; the whole reason must match). Defaults to
	// any.
	Reason string `json:"reason,omitempty"`
	// FromTopic keeps only messages poisoned from this topic. Defaults to
	// any.
	FromTopic string `json:"from_topic,omitempty"`
	// PoisonedBefore keeps only messages poisoned (written to the poison
	// topic) before it. Defaults to any.
	PoisonedBefore time.Time `json:"poisoned_before,omitzero"`
}

// Selected reports whether q selects anything in particular (a condition
// is set).
func (q Query) Selected() bool {
	return q.Reason != "" || q.FromTopic != "" || !q.PoisonedBefore.IsZero()
}

// DryRun is what a bulk requeue of a Query would act on.
type DryRun struct {
	Count int
	// First are the newest messages selected.
	First []Message
}

// matching reads topic and returns the messages q selects, newest first.
func matching(ctx context.Context, brokers []string, topic string, q Query) ([]Message, error) {
	match, err := bulk.Match(q.Reason, q.PoisonedBefore)
	if err != nil {
		return nil, err
	}
	_, msgs, err := Read(ctx, brokers, topic, 0)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(msgs, func(m Message) bool {
		return q.FromTopic != "" && m.Topic != q.FromTopic || !match(m.Reason, m.Time)
	}), nil
}

// DryRunMatching counts the messages of topic q selects and returns the
// newest of them (page messages; 20 when page <= 0). It changes nothing.
func DryRunMatching(ctx context.Context, brokers []string, topic string, q Query, page int) (*DryRun, error) {
	if page <= 0 {
		page = 20
	}
	msgs, err := matching(ctx, brokers, topic, q)
	if err != nil {
		return nil, err
	}
	return &DryRun{Count: len(msgs), First: msgs[:min(page, len(msgs))]}, nil
}

// Outcome is the outcome of a bulk requeue.
type Outcome struct {
	// Matched is how many messages the query selected.
	Matched int `json:"matched"`
	// Requeued is how many of them were sent back to their topic.
	Requeued int `json:"requeued"`
	// Refused counts the selected messages not sent, by why.
	Refused map[string]int `json:"refused"`
}

// RefusedNoTopic is why a message is not requeued in bulk: it does not
// say the topic it was poisoned from (or is not a Watermill message).
const RefusedNoTopic = "does not say its original topic"

// RequeueMatching publishes the messages of topic q selects back to the
// topic each was poisoned from, as Requeue, oldest first, and says how
// many it matched, sent and refused (a message that does not say its
// original topic is refused and counted, not sent). Messages cannot be
// discarded from a Kafka topic one by one; the poison topic keeps what
// was requeued (requeue it once) until its retention removes it.
func RequeueMatching(ctx context.Context, brokers []string, topic string, q Query) (Outcome, error) {
	msgs, err := matching(ctx, brokers, topic, q)
	if err != nil {
		return Outcome{}, err
	}
	out := Outcome{Matched: len(msgs), Refused: map[string]int{}}
	pick := slices.DeleteFunc(msgs, func(m Message) bool {
		if m.msg == nil || m.Topic == "" {
			out.Refused[RefusedNoTopic]++
			return true
		}
		return false
	})
	out.Requeued, err = send(brokers, pick)
	return out, err
}

// send publishes msgs (newest first, as Read returns them) back to the
// topics they were poisoned from, oldest first, and returns how many it
// sent.
func send(brokers []string, msgs []Message) (int, error) {
	byTopic := map[string][]*message.Message{}
	var order []string
	for i := len(msgs) - 1; i >= 0; i-- { // oldest first, as they came
		m := msgs[i]
		out := message.NewMessage(m.UUID, m.msg.Payload)
		for k, v := range m.Metadata {
			out.Metadata.Set(k, v)
		}
		if byTopic[m.Topic] == nil {
			order = append(order, m.Topic)
		}
		byTopic[m.Topic] = append(byTopic[m.Topic], out)
	}
	if len(order) == 0 {
		return 0, nil
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	n := 0
	for _, t := range order {
		if err := pub.Publish(t, byTopic[t]...); err != nil {
			return n, fmt.Errorf("poison: requeue to %s: %w", t, err)
		}
		n += len(byTopic[t])
	}
	return n, nil
}
