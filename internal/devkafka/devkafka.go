// Package devkafka runs an embedded Kafka-protocol broker (franz-go's kfake)
// for development, tests and the demo. Clients talk to it over TCP exactly as
// they would to a real cluster. As in Apache Kafka, a consumer-group member
// whose connection is gone is evicted when its session times out, also one
// that died while joining its group, and a member waiting for its JoinGroup
// or SyncGroup reply is not expired while it waits (kfake alone did both
// wrong; see evictor).
package devkafka

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Config configures an embedded broker.
type Config struct {
	// Port to listen on at 127.0.0.1. Defaults to 0, a free port.
	Port int
	// Brokers is the number of brokers, each on a free port when there
	// are several (Port applies to a single broker). Partition leadership
	// is spread over them. Defaults to 1.
	Brokers int
	// Partitions is the number of partitions of auto-created topics.
	// Defaults to 8.
	Partitions int
	// DataDir, when set, persists the broker's state there so that a broker
	// restarted on the same DataDir and Port keeps its topics and records,
	// after Close and after the process is killed (SIGKILL): a topic is
	// written to disk when it is created, before any record of it is
	// acknowledged, auto-created topics included, and records are written
	// to the operating system as they are acknowledged. A crash of the
	// machine itself may lose the last records (kfake does not fsync each
	// batch, as Kafka does not by default).
	DataDir string
	// BrokerConfigs are broker settings, for example message.max.bytes.
	// Defaults to none (kfake's defaults).
	BrokerConfigs map[string]string
	// NoAutoCreate makes the broker create no topic on first use, as
	// Apache Kafka with auto.create.topics.enable=false: a topic exists
	// once something creates it. Defaults to false.
	NoAutoCreate bool
}

// Broker is a running embedded broker.
type Broker struct {
	cluster *kfake.Cluster
	evictor *evictor

	closeOnce sync.Once
}

// Start starts a broker on 127.0.0.1 that creates topics on first use
// (unless cfg.NoAutoCreate).
func Start(cfg Config) (*Broker, error) {
	if cfg.Partitions <= 0 {
		cfg.Partitions = 8
	}
	if cfg.Brokers <= 0 {
		cfg.Brokers = 1
	}
	ports := make([]int, cfg.Brokers)
	if cfg.Brokers == 1 {
		ports[0] = cfg.Port
	}
	ev := newEvictor()
	opts := []kfake.Opt{
		kfake.ListenFn(ev.listen),
		kfake.NumBrokers(cfg.Brokers),
		kfake.Ports(ports...),
		kfake.DefaultNumPartitions(cfg.Partitions),
	}
	if !cfg.NoAutoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if len(cfg.BrokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(cfg.BrokerConfigs))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("devkafka: start embedded broker on 127.0.0.1:%d: %w", cfg.Port, err)
	}
	if !cfg.NoAutoCreate {
		createOnMetadata(c, int32(cfg.Partitions))
	}
	ev.start(c)
	return &Broker{cluster: c, evictor: ev}, nil
}

// createOnMetadata makes the broker create a topic a metadata request asks
// for (with auto-creation allowed) through CreateTopic, as a CreateTopics
// request would, before answering it. kfake's own auto-creation keeps such
// a topic in memory only: its list of topics on disk is written when a
// topic is created explicitly or changed, so a broker killed with SIGKILL
// came back without its auto-created topics, and made them again with
// offsets starting over on top of their old records.
func createOnMetadata(c *kfake.Cluster, partitions int32) {
	c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req, ok := kreq.(*kmsg.MetadataRequest)
		// Before version 4 a metadata request always allows auto-creation.
		if !ok || req.Version >= 4 && !req.AllowAutoTopicCreation {
			return nil, nil, false
		}
		for _, rt := range req.Topics {
			if rt.Topic == nil || *rt.Topic == "" || c.TopicInfo(*rt.Topic) != nil {
				continue
			}
			// An invalid name fails here and again, with its error code,
			// in kfake's answer; TOPIC_ALREADY_EXISTS means a concurrent
			// request made it.
			_ = c.CreateTopic(*rt.Topic, partitions, nil)
		}
		return nil, nil, false // kfake answers, now finding the topic
	})
}

// Addrs returns the broker's host:port addresses.
func (b *Broker) Addrs() []string { return b.cluster.ListenAddrs() }

// Port returns the port of the first listener.
func (b *Broker) Port() int {
	_, p, _ := net.SplitHostPort(b.Addrs()[0])
	n, _ := strconv.Atoi(p)
	return n
}

// Cluster returns the underlying kfake cluster, for fault injection in tests.
func (b *Broker) Cluster() *kfake.Cluster { return b.cluster }

// Close stops the broker and closes its connections. It is idempotent.
func (b *Broker) Close() {
	b.closeOnce.Do(func() {
		b.evictor.close()
		b.cluster.Close()
	})
}

// EnvBrokers returns the brokers named by KAFKA_BROKERS (comma-separated),
// or nil when it is unset.
func EnvBrokers() []string {
	v := strings.TrimSpace(os.Getenv("KAFKA_BROKERS"))
	if v == "" {
		return nil
	}
	var out []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}
