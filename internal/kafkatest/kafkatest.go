// Package kafkatest gives tests a Kafka to talk to over TCP: the cluster in
// KAFKA_BROKERS when set, otherwise an embedded kfake broker per test.
package kafkatest

import (
	"testing"

	"github.com/millrace/millrace/internal/devkafka"
	"github.com/millrace/millrace/internal/pgtest"
)

// Brokers returns broker addresses for the test: KAFKA_BROKERS when set,
// otherwise a fresh embedded broker that is closed when the test ends.
func Brokers(t testing.TB) []string {
	t.Helper()
	if b := devkafka.EnvBrokers(); b != nil {
		return b
	}
	b := Embedded(t, devkafka.Config{})
	return b.Addrs()
}

// Embedded starts an embedded broker for the test whatever KAFKA_BROKERS
// says, for tests that stop and restart the broker or inject faults.
func Embedded(t testing.TB, cfg devkafka.Config) *devkafka.Broker {
	t.Helper()
	b, err := devkafka.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// Real reports whether tests run against a real cluster (KAFKA_BROKERS set).
func Real() bool { return devkafka.EnvBrokers() != nil }

// Topic returns a topic name no other test uses.
func Topic() string { return pgtest.RandomName("topic") }

// Group returns a consumer-group name no other test uses.
func Group() string { return pgtest.RandomName("group") }
