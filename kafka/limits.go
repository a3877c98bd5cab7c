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

// The record batch limit of a topic is the lower of MaxMessageBytes and the
// topic's max.message.bytes, read once with DescribeConfigs and kept. The
// client caps its batches of the topic at the same value
// (kgo.ProducerBatchMaxBytesFn → batchLimit), and Publish refuses a record
// that does not fit alone before sending it, so a broker never refuses a
// batch for size unless the topic's limit is lowered while the Publisher
// runs. Then the broker's MESSAGE_TOO_LARGE makes the Publisher read the
// limit again (refreshLimit), keep the lower value and renew its client.

// limitFor returns the record batch limit of topic, asking the cluster the
// first time. When the cluster does not say (DescribeConfigs refused, the
// topic not there yet), MaxMessageBytes stands in and the cluster is asked
// again after askAgain.
func (p *Publisher) limitFor(topic string) int32 {
	p.limitsMu.Lock()
	l, ok := p.limits[topic]
	guess, guessed := p.guesses[topic]
	p.limitsMu.Unlock()
	if ok {
		return l
	}
	if guessed && time.Since(guess) < askAgain {
		return p.maxBytes
	}
	l, known := p.describeLimit(topic)
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	if !known {
		p.guesses[topic] = time.Now()
		return l
	}
	delete(p.guesses, topic)
	if old, ok := p.limits[topic]; ok && old < l {
		return old
	}
	p.limits[topic] = l
	return l
}

// askAgain is how long a topic's limit stays MaxMessageBytes when the
// cluster did not say what it is.
const askAgain = time.Minute

// refreshLimit reads topic's limit again after the broker refused a batch
// for size, keeps the lower of the old and new values, and has the client
// renewed if it went down.
func (p *Publisher) refreshLimit(topic string) int32 {
	fresh, known := p.describeLimit(topic)
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	old, ok := p.limits[topic]
	if !ok {
		old = p.maxBytes
	}
	if known && fresh < old {
		p.limits[topic] = fresh
		p.stale = "a topic's max.message.bytes is lower than it was"
		return fresh
	}
	return old
}

// batchLimit is the client's per-topic batch cap: what limitFor settled on.
// The client asks when it first meets a partition of the topic, which is
// after Publish called limitFor.
func (p *Publisher) batchLimit(topic string) int32 {
	p.limitsMu.Lock()
	defer p.limitsMu.Unlock()
	if l, ok := p.limits[topic]; ok {
		return l
	}
	return p.maxBytes
}

// describeLimit asks the cluster for topic's max.message.bytes and returns
// the lower of it and MaxMessageBytes. known is false when the cluster did
// not say (the topic does not exist yet, or DescribeConfigs failed): the
// result is then MaxMessageBytes, and the question is asked again next time.
func (p *Publisher) describeLimit(topic string) (limit int32, known bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := describeTopicConfig(ctx, p.client, topic)
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		// Not created yet: a metadata request creates it if the cluster
		// auto-creates topics; then ask again.
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		req.AllowAutoTopicCreation = true
		if _, merr := req.RequestWith(ctx, p.client); merr == nil {
			v, err = describeTopicConfig(ctx, p.client, topic)
		}
	}
	if err != nil {
		p.logger.Info("Kafka topic's max.message.bytes unknown; using MaxMessageBytes", watermill.LogFields{
			"topic": topic, "max_message_bytes": p.maxBytes, "err": err,
		})
		return p.maxBytes, false
	}
	return min(v, p.maxBytes), true
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
