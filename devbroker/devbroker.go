// Package devbroker runs an embedded Kafka-protocol broker in the process,
// for development, examples and tests: franz-go's kfake, listening on
// 127.0.0.1 and creating topics on first use. Clients (millrace's kafka
// publisher, watermill-kafka's subscriber, any Kafka client) talk to it
// over TCP exactly as they would to a real cluster. It keeps its records in
// memory, so it is not for production: point those at a real cluster.
//
//	b, err := devbroker.Start(devbroker.Config{})
//	if err != nil {
//		return err
//	}
//	defer b.Close()
//	brokers := b.Addrs() // for kafka.PublisherConfig.Brokers, service.Config.Brokers
//
// The same broker runs as a binary with go run ./cmd/millrace-kafka.
package devbroker

import "github.com/millrace/millrace/internal/devkafka"

// Config configures an embedded broker.
type Config struct {
	// Port to listen on at 127.0.0.1. Defaults to 0, a free port.
	Port int
	// Partitions is the number of partitions of the topics it creates.
	// Defaults to 8.
	Partitions int
}

// Broker is a running embedded broker. It is safe for concurrent use.
type Broker struct {
	b *devkafka.Broker
}

// Start starts a one-node broker on 127.0.0.1.
func Start(cfg Config) (*Broker, error) {
	b, err := devkafka.Start(devkafka.Config{Port: cfg.Port, Partitions: cfg.Partitions})
	if err != nil {
		return nil, err
	}
	return &Broker{b: b}, nil
}

// Addrs returns the broker's host:port address, as a list of brokers.
func (b *Broker) Addrs() []string { return b.b.Addrs() }

// Close stops the broker and closes its connections.
func (b *Broker) Close() { b.b.Close() }

// EnvBrokers returns the brokers the KAFKA_BROKERS environment variable
// names (comma-separated host:port addresses), nil when it is unset or
// empty: a program that runs on a real cluster when told so and on an
// embedded broker otherwise starts from it.
func EnvBrokers() []string { return devkafka.EnvBrokers() }
