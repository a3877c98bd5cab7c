// Package devkafka runs an embedded Kafka-protocol broker (franz-go's kfake)
// for development, tests and the demo. Clients talk to it over TCP exactly as
// they would to a real cluster.
package devkafka

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kfake"
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
	// restarted on the same DataDir and Port keeps its topics and records.
	DataDir string
	// BrokerConfigs are broker settings, for example message.max.bytes.
	// Defaults to none (kfake's defaults).
	BrokerConfigs map[string]string
}

// Broker is a running embedded broker.
type Broker struct {
	cluster *kfake.Cluster
}

// Start starts a one-node broker on 127.0.0.1 that creates topics on first use.
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
	opts := []kfake.Opt{
		kfake.NumBrokers(cfg.Brokers),
		kfake.Ports(ports...),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(cfg.Partitions),
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
	return &Broker{cluster: c}, nil
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

// Close stops the broker and closes its connections.
func (b *Broker) Close() { b.cluster.Close() }

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
