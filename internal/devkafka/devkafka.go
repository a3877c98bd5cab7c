// Package devkafka runs an embedded Kafka-protocol broker (franz-go's kfake)
// for development, tests and the demo. Clients talk to it over TCP exactly as
// they would to a real cluster. As in Apache Kafka, a consumer-group member
// whose connection is gone is evicted when its session times out, also one
// that died while joining its group, and a member waiting for its JoinGroup
// or SyncGroup reply is not expired while it waits (kfake alone did both
// wrong; see evictor).
package devkafka

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/kafka"
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
		if err := dropBadTopics(cfg.DataDir); err != nil {
			return nil, fmt.Errorf("devkafka: %w", err)
		}
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if len(cfg.BrokerConfigs) > 0 {
		opts = append(opts, kfake.BrokerConfigs(cfg.BrokerConfigs))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("devkafka: start embedded broker on 127.0.0.1:%d: %w", cfg.Port, err)
	}
	createOnMetadata(c, int32(cfg.Partitions), !cfg.NoAutoCreate)
	refuseBadTopics(c)
	ev.start(c)
	return &Broker{cluster: c, evictor: ev}, nil
}

// createOnMetadata makes the broker create a topic a metadata request asks
// for (with auto-creation allowed, and when autoCreate) through
// CreateTopic, as a CreateTopics request would, before answering it, and
// never lets kfake create one itself. kfake's own auto-creation keeps such
// a topic in memory only: its list of topics on disk is written when a
// topic is created explicitly or changed, so a broker killed with SIGKILL
// came back without its auto-created topics, and made them again with
// offsets starting over on top of their old records. And it creates a
// topic of any name, where Kafka refuses the names kafka.ValidateTopic
// refuses: one longer than a file name can be made a broker restarted on
// its data directory fail to start.
func createOnMetadata(c *kfake.Cluster, partitions int32, autoCreate bool) {
	c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req, ok := kreq.(*kmsg.MetadataRequest)
		if !ok {
			return nil, nil, false
		}
		// Before version 4 a metadata request always allows auto-creation.
		if autoCreate && (req.Version < 4 || req.AllowAutoTopicCreation) {
			for _, rt := range req.Topics {
				if rt.Topic == nil || kafka.ValidateTopic(*rt.Topic) != nil || c.TopicInfo(*rt.Topic) != nil {
					continue
				}
				// TOPIC_ALREADY_EXISTS means a concurrent request made it.
				_ = c.CreateTopic(*rt.Topic, partitions, nil)
			}
		}
		req.AllowAutoTopicCreation = false
		return nil, nil, false // kfake answers, now finding the topics made
	})
}

// refuseBadTopics answers a CreateTopics request that names a topic Kafka
// refuses (kafka.ValidateTopic) as Kafka does, INVALID_TOPIC_EXCEPTION for
// that topic, creating its other topics (with their partitions and
// configs) through CreateTopic. Other requests go to kfake as they are.
func refuseBadTopics(c *kfake.Cluster) {
	c.ControlKey(int16(kmsg.CreateTopics), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req, ok := kreq.(*kmsg.CreateTopicsRequest)
		if !ok || !slices.ContainsFunc(req.Topics, func(rt kmsg.CreateTopicsRequestTopic) bool { return kafka.ValidateTopic(rt.Topic) != nil }) {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			if err := kafka.ValidateTopic(rt.Topic); err != nil {
				st.ErrorCode, st.ErrorMessage = kerr.InvalidTopicException.Code, kmsg.StringPtr(err.Error())
			} else if !req.ValidateOnly {
				configs := map[string]string{}
				for _, rc := range rt.Configs {
					if rc.Value != nil {
						configs[rc.Name] = *rc.Value
					}
				}
				var ke *kerr.Error
				if err := c.CreateTopic(rt.Topic, rt.NumPartitions, configs); errors.As(err, &ke) {
					st.ErrorCode = ke.Code
				}
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// dropBadTopics removes from a data directory's list of topics those whose
// names Kafka refuses (kafka.ValidateTopic), which an older broker may
// have made: kfake fails to load a topic whose partition directory cannot
// exist (a name longer than a file name can be), and with it every other.
// The rest loads as it was.
func dropBadTopics(dir string) error {
	path := filepath.Join(dir, "topics.json")
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var list map[string]json.RawMessage
	if err := json.Unmarshal(data, &list); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	var topics []map[string]json.RawMessage
	if err := json.Unmarshal(list["topics"], &topics); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	kept := topics[:0]
	for _, t := range topics {
		var name string
		if json.Unmarshal(t["name"], &name) == nil && kafka.ValidateTopic(name) != nil {
			slog.Warn("devkafka: dropping a topic Kafka does not allow from the data directory", "topic", name, "dir", dir)
			continue
		}
		kept = append(kept, t)
	}
	if len(kept) == len(topics) {
		return nil
	}
	if list["topics"], err = json.Marshal(kept); err != nil {
		return err
	}
	if data, err = json.Marshal(list); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
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
