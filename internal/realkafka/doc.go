// Package realkafka holds the failover tests of the real-Kafka tier: they
// kill, stop and restart nodes of the three-node Apache Kafka cluster that
// scripts/kafka-up.sh starts, while the relay drains the outbox, and check
// with a consumer of their own that nothing was lost or reordered. They run
// in the failover step of make test (MILLRACE_FAILOVER=1), one package at a
// time, since they take brokers away from every other test.
package realkafka
