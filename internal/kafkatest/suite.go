package kafkatest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// GroupSubscriber is the subscriber side of Watermill's conformance suite:
// watermill-kafka's subscriber in a consumer group, the given one, or else
// one per topic, the same for every subscriber of the suite, so that a
// subscriber made later continues where an earlier one stopped (what the
// suite expects of a subscriber without a group) without every test of the
// suite rebalancing one shared group. SubscribeInitialize creates the topic
// with several partitions, so that unkeyed messages really spread, and the
// cluster's default replication factor, so that a cluster that wants
// several in-sync replicas accepts acks=all writes to it.
type GroupSubscriber struct {
	brokers []string
	group   string

	mu   sync.Mutex
	subs []*wkafka.Subscriber
}

// NewGroupSubscriber returns a GroupSubscriber on brokers in group ("" for
// one group per topic). What it has not closed when the test ends is closed
// then (the suite's order test subscribes after closing its subscriber).
func NewGroupSubscriber(t testing.TB, brokers []string, group string) *GroupSubscriber {
	s := &GroupSubscriber{brokers: brokers, group: group}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func (s *GroupSubscriber) subscriber(topic string) (*wkafka.Subscriber, error) {
	group := s.group
	if group == "" {
		group = "cg_" + topic
	}
	sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:                s.brokers,
		Unmarshaler:            wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig:  SaramaSubscriberConfig(),
		ConsumerGroup:          group,
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: -1},
	}, nil)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
	return sub, nil
}

// Subscribe subscribes a new watermill-kafka subscriber to topic.
func (s *GroupSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	sub, err := s.subscriber(topic)
	if err != nil {
		return nil, err
	}
	return sub.Subscribe(ctx, topic)
}

// SubscribeInitialize creates topic with four partitions.
func (s *GroupSubscriber) SubscribeInitialize(topic string) error {
	sub, err := s.subscriber(topic)
	if err != nil {
		return err
	}
	return sub.SubscribeInitialize(topic)
}

// Close closes every subscriber made so far.
func (s *GroupSubscriber) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var first error
	for _, sub := range s.subs {
		if err := sub.Close(); err != nil && first == nil {
			first = err
		}
	}
	s.subs = nil
	return first
}

// CreateTopic creates topic with the given number of partitions (-1: the
// cluster's default), the cluster's default replication factor and the
// given topic configs (max.message.bytes, ...), the same way on the
// embedded broker and on a real cluster.
func CreateTopic(t testing.TB, brokers []string, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30_000
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	for k, v := range configs {
		rc := kmsg.NewCreateTopicsRequestTopicConfig()
		rc.Name, rc.Value = k, kmsg.StringPtr(v)
		rt.Configs = append(rt.Configs, rc)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, c)
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	waitTopicEverywhere(ctx, t, c, topic)
}

// waitTopicEverywhere waits until every broker of the cluster answers a
// metadata request for topic with a leader for each partition. On a
// cluster a broker learns of a new topic from the metadata log a moment
// after the controller created it, and a producer that asks it first is
// told the topic does not exist (a client with few retries gives up).
func waitTopicEverywhere(ctx context.Context, t testing.TB, c *kgo.Client, topic string) {
	t.Helper()
	untilEveryBroker(ctx, t, c, "serve topic "+topic, func(b *kgo.Broker) (bool, error) {
		req := kmsg.NewPtrMetadataRequest()
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, b)
		return err == nil && len(resp.Topics) == 1 && resp.Topics[0].ErrorCode == 0 &&
			len(resp.Topics[0].Partitions) > 0 && ledEverywhere(resp.Topics[0].Partitions), err
	})
}

// untilEveryBroker asks each broker of the cluster, every 50 ms, until ok
// says yes, and fails t (with what) when ctx ends first.
func untilEveryBroker(ctx context.Context, t testing.TB, c *kgo.Client, what string, ok func(*kgo.Broker) (bool, error)) {
	t.Helper()
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, c)
	if err != nil {
		t.Fatalf("metadata: %v", err)
	}
	for _, b := range meta.Brokers {
		for {
			done, err := ok(c.Broker(int(b.NodeID)))
			if done {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("broker %d does not %s: %v", b.NodeID, what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func ledEverywhere(ps []kmsg.MetadataResponseTopicPartition) bool {
	for _, p := range ps {
		if p.ErrorCode != 0 || p.Leader < 0 {
			return false
		}
	}
	return true
}

// SetTopicConfig sets one configuration of topic (IncrementalAlterConfigs)
// and waits until every broker of the cluster reports the new value: on a
// cluster, a broker learns a topic's configuration from the metadata log a
// moment after the controller accepted it.
func SetTopicConfig(t testing.TB, brokers []string, topic, name, value string) {
	t.Helper()
	c, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	rr := kmsg.NewIncrementalAlterConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	rc := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	rc.Name, rc.Op, rc.Value = name, kmsg.IncrementalAlterConfigOpSet, kmsg.StringPtr(value)
	rr.Configs = append(rr.Configs, rc)
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, c)
	if err != nil {
		t.Fatalf("set %s of topic %s: %v", name, topic, err)
	}
	if err := kerr.ErrorForCode(resp.Resources[0].ErrorCode); err != nil {
		t.Fatalf("set %s of topic %s: %v", name, topic, err)
	}
	untilEveryBroker(ctx, t, c, fmt.Sprintf("report %s of topic %s = %s", name, topic, value), func(b *kgo.Broker) (bool, error) {
		dreq := kmsg.NewPtrDescribeConfigsRequest()
		dr := kmsg.NewDescribeConfigsRequestResource()
		dr.ResourceType, dr.ResourceName = kmsg.ConfigResourceTypeTopic, topic
		dr.ConfigNames = []string{name}
		dreq.Resources = append(dreq.Resources, dr)
		dresp, err := dreq.RequestWith(ctx, b)
		return err == nil && len(dresp.Resources) == 1 && len(dresp.Resources[0].Configs) == 1 &&
			dresp.Resources[0].Configs[0].Value != nil && *dresp.Resources[0].Configs[0].Value == value, err
	})
}
