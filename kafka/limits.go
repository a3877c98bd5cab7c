package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// What the Publisher knows of each topic it sends to: whether it exists,
// and its record batch limit, the lower of MaxMessageBytes and the topic's
// max.message.bytes, read with DescribeConfigs. The client caps its
// batches of a partition at the limit it is told when it first meets the
// partition (kgo.ProducerBatchMaxBytesFn → batchLimit), and Publish
// refuses a record that does not fit alone before sending it, so a broker
// refuses a batch for size only when the topic's limit was lowered since.
//
// The limit is read again when it may have changed: when the broker
// refused a batch for size (refreshLimit: the lower value is kept), when a
// record does not fit it (rereadLimit: the limit may have been raised), and
// when the cluster did not say it (askAgain). When the limit in use is no
// longer what the client was told, the client is renewed before the
// records go out, so that its batches fit the topic.

// topicState is what the Publisher knows of one topic. Under limitsMu.
type topicState struct {
	// limit is the record batch limit in use: the cluster's, or
	// MaxMessageBytes while it is not known.
	limit int32
	known bool
	// missing: the cluster has no such topic and does not create it on
	// first use. Its records fail at once, without going to the client,
	// until it is asked again (after missingRecheck).
	missing bool
	askedAt time.Time
	// told is the limit the client was given for the topic's partitions
	// (0: none yet).
	told int32
}

// askAgain is how long a topic's limit stays MaxMessageBytes when the
// cluster did not say what it is.
const askAgain = time.Minute

// missingRecheck is how long a topic found missing is taken as missing
// before the cluster is asked again: its records fail at once meanwhile,
// and a call that holds them does not wait for the cluster.
const missingRecheck = time.Second

// errMissingTopic is the error of a record of a topic the cluster does
// not have and does not create. The topic is at fault, not the record, and
// not for good (someone may create it): it is neither temporary nor
// permanent; the outbox relay charges an attempt for it and dead-letters
// the event after its MaxAttempts.
func errMissingTopic(topic string, err error) error {
	return fmt.Errorf("kafka: topic %s does not exist and the cluster does not create it: %w", topic, err)
}

// topic returns topic's state, made on first use. Under limitsMu.
func (p *Publisher) topic(topic string) *topicState {
	st, ok := p.topics[topic]
	if !ok {
		st = &topicState{limit: p.maxBytes}
		p.topics[topic] = st
	}
	return st
}

// limitFor returns the record batch limit of topic, asking the cluster
// the first time, and again after askAgain when it did not say (after
// missingRecheck when the topic was missing). A missing topic returns an
// error (errMissingTopic). Called under sendMu, before a call's records
// are buffered.
func (p *Publisher) limitFor(topic string) (int32, error) {
	p.limitsMu.Lock()
	st := p.topic(topic)
	wait := askAgain
	if st.missing {
		wait = missingRecheck
	}
	if st.known && !st.missing || !st.askedAt.IsZero() && time.Since(st.askedAt) < wait {
		defer p.limitsMu.Unlock()
		return st.limit, p.missingErr(topic, st)
	}
	p.limitsMu.Unlock()
	l, known, err := p.describeLimit(topic)
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	// A topic not found at its first look goes to the client, which waits
	// for it to be created (UnknownTopicRetries); it is missing once the
	// client failed its records so (markMissing), until it is found.
	st.askedAt = time.Now()
	st.missing = st.missing && errors.Is(err, kerr.UnknownTopicOrPartition)
	if known && (!st.known || l < st.limit) {
		st.limit, st.known = l, true
	}
	p.checkTold(topic, st)
	return st.limit, p.missingErr(topic, st)
}

func (p *Publisher) missingErr(topic string, st *topicState) error {
	if st.missing {
		return errMissingTopic(topic, kerr.UnknownTopicOrPartition)
	}
	return nil
}

// markMissing records that the client failed a record of topic because
// the cluster does not know it (the topic was deleted, say).
func (p *Publisher) markMissing(topic string) {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	st := p.topic(topic)
	st.missing, st.askedAt = true, time.Now()
}

// rereadLimit reads topic's limit again when a record does not fit the
// one in use: the topic's limit may have been raised. It returns the
// limit now in use.
func (p *Publisher) rereadLimit(topic string) int32 {
	l, known, _ := p.describeLimit(topic)
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	st := p.topic(topic)
	if known {
		st.limit, st.known, st.askedAt = l, true, time.Now()
		p.checkTold(topic, st)
	}
	return st.limit
}

// refreshLimit reads topic's limit again after the broker refused a batch
// for size, keeps the lower of the old and new values, and has the client
// renewed if it went down.
func (p *Publisher) refreshLimit(topic string) int32 {
	fresh, known, _ := p.describeLimit(topic)
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	st := p.topic(topic)
	if known && fresh < st.limit {
		st.limit, st.known, st.askedAt = fresh, true, time.Now()
		p.checkTold(topic, st)
	}
	return st.limit
}

// checkTold has the client renewed (p.stale) when the limit in use is not
// what it was told for the topic's partitions. Under limitsMu.
func (p *Publisher) checkTold(topic string, st *topicState) {
	if st.told != 0 && st.told != st.limit {
		p.stale = fmt.Sprintf("topic %s takes records of up to %d bytes, the client's batches %d", topic, st.limit, st.told)
	}
}

// batchLimit is the client's per-topic batch cap: the limit in use. The
// client asks when it first meets a partition of the topic, which is
// after Publish called limitFor.
func (p *Publisher) batchLimit(topic string) int32 {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	st := p.topic(topic)
	st.told = st.limit
	return st.limit
}

// clientRenewed forgets what the old client was told.
func (p *Publisher) clientRenewed() {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	for _, st := range p.topics {
		st.told = 0
	}
}

// describeLimit asks the cluster for topic's max.message.bytes and returns
// the lower of it and MaxMessageBytes. known is false when the cluster did
// not say: the result is then MaxMessageBytes, and err says why (wrapping
// kerr.UnknownTopicOrPartition when the topic does not exist, even after
// a metadata request allowed to create it: a cluster that creates topics
// on first use may take a moment to, and Apache Kafka answers so while it
// does).
func (p *Publisher) describeLimit(topic string) (limit int32, known bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := describeTopicConfig(ctx, p.client, topic)
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// Not created yet: a metadata request creates it if the cluster
		// auto-creates topics; then ask again.
		if exists, merr := p.topicExists(ctx, topic); merr == nil && exists {
			v, err = describeTopicConfig(ctx, p.client, topic)
		}
	}
	if err != nil {
		p.logger.Info("Kafka topic's max.message.bytes unknown; using MaxMessageBytes", watermill.LogFields{
			"topic": topic, "max_message_bytes": p.maxBytes, "err": err,
		})
		return p.maxBytes, false, err
	}
	return min(v, p.maxBytes), true, nil
}

// topicExists asks the cluster for topic's metadata, allowing it to create
// the topic, and says whether it has the topic.
func (p *Publisher) topicExists(ctx context.Context, topic string) (bool, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = true
	resp, err := req.RequestWith(ctx, p.client)
	if err != nil {
		return false, err
	}
	if len(resp.Topics) != 1 {
		return false, fmt.Errorf("kafka: metadata of topic %s: %d topics in the answer", topic, len(resp.Topics))
	}
	return resp.Topics[0].ErrorCode != kerr.UnknownTopicOrPartition.Code, nil
}

// client is what describeTopicConfig needs of a *kgo.Client.
type client interface {
	Request(context.Context, kmsg.Request) (kmsg.Response, error)
}

// describeTopicConfig returns the topic's max.message.bytes as the cluster
// applies it. The broker-wide message.max.bytes is asked for as well: a
// cluster that reports the broker setting under its own name rather than as
// the topic's (kfake does) is read right too. Of several answers, the most
// specific source wins: the topic's own setting, then the broker's, then
// the default.
func describeTopicConfig(ctx context.Context, c client, topic string) (int32, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType = kmsg.ConfigResourceTypeTopic
	rr.ResourceName = topic
	rr.ConfigNames = []string{"max.message.bytes", "message.max.bytes"}
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, c)
	if err != nil {
		return 0, err
	}
	best, rank := int32(0), 100
	for _, res := range resp.Resources {
		if res.ResourceName != topic {
			continue
		}
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			return 0, err
		}
		for _, c := range res.Configs {
			if c.Name != "max.message.bytes" && c.Name != "message.max.bytes" || c.Value == nil {
				continue
			}
			n, err := strconv.ParseInt(*c.Value, 10, 32)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("topic %s: %s = %q", topic, c.Name, *c.Value)
			}
			r := int(c.Source) // 1 topic, 2-4 broker, 5 default; 0 unknown (old versions)
			if r <= 0 {
				r = 50
			}
			if r < rank {
				best, rank = int32(n), r
			}
		}
	}
	if rank == 100 {
		return 0, fmt.Errorf("topic %s: no max.message.bytes in the DescribeConfigs response", topic)
	}
	return best, nil
}
