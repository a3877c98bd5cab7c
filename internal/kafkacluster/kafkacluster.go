// Package kafkacluster controls the three-node Apache Kafka cluster that
// scripts/kafka-up.sh starts on loopback, for the failover tests of the
// real-Kafka tier: it kills (SIGKILL), stops (SIGSTOP), continues (SIGCONT)
// and restarts one node by its number, finds the leader of a partition, and
// waits until the cluster is whole again.
//
// The script keeps each node's pid and start script in the cluster's
// directory (MILLRACE_KAFKA_DIR, default /tmp/millrace-kafka); this package
// reads them, so any process on the machine can act on the nodes.
package kafkacluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// DefaultDir is where scripts/kafka-up.sh keeps the cluster's state when
// MILLRACE_KAFKA_DIR is not set.
const DefaultDir = "/tmp/millrace-kafka"

// Cluster is the cluster in one directory. Safe for concurrent use.
type Cluster struct {
	dir     string
	brokers []string
}

// Dir returns the cluster's directory from MILLRACE_KAFKA_DIR, else DefaultDir.
func Dir() string {
	if d := os.Getenv("MILLRACE_KAFKA_DIR"); d != "" {
		return d
	}
	return DefaultDir
}

// Open reads the cluster in dir, as scripts/kafka-up.sh left it.
func Open(dir string) (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(dir, "brokers"))
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: no cluster in %s (scripts/kafka-up.sh starts one): %w", dir, err)
	}
	var brokers []string
	for _, s := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if s = strings.TrimSpace(s); s != "" {
			brokers = append(brokers, s)
		}
	}
	if len(brokers) == 0 {
		return nil, fmt.Errorf("kafkacluster: %s/brokers is empty", dir)
	}
	return &Cluster{dir: dir, brokers: brokers}, nil
}

// Require returns the cluster for a failover test. Such tests kill broker
// nodes, so they run only in the failover step of make test (MILLRACE_FAILOVER=1,
// one package at a time, after the rest of the real-Kafka tier); elsewhere
// the test is skipped with that reason. With MILLRACE_FAILOVER=1 but no
// cluster of scripts/kafka-up.sh's to control, the test fails.
//
// Before the test it deletes the topics the tests before it left (DropTopics):
// the real-Kafka tier leaves a few hundred, two thousand partitions, and a
// node restarted with all of them took 70 to 80 s to be back in sync.
func Require(t testing.TB) *Cluster {
	t.Helper()
	if os.Getenv("MILLRACE_FAILOVER") != "1" {
		t.Skip("failover step only (kills broker nodes of the three-node cluster): make test runs it with MILLRACE_FAILOVER=1")
	}
	c, err := Open(Dir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatalf("the cluster is not whole before the test: %v", err)
	}
	if err := c.DropTopics(ctx); err != nil {
		t.Fatalf("deleting the topics earlier tests left: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := c.Restore(ctx); err != nil {
			t.Errorf("restoring the cluster after the test: %v", err)
		}
	})
	return c
}

// DropTopics deletes every topic of the cluster but Kafka's internal ones,
// and waits until the cluster's metadata lists none of them. Only for a
// cluster no other test is using.
func (c *Cluster) DropTopics(ctx context.Context) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		return err
	}
	names := listed.Names()
	if len(names) == 0 {
		return nil
	}
	resps, err := adm.DeleteTopics(ctx, names...)
	if err != nil {
		return err
	}
	for _, r := range resps.Sorted() {
		if r.Err != nil && !errors.Is(r.Err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %s: %w", r.Topic, r.Err)
		}
	}
	for {
		left, err := adm.ListTopics(ctx)
		if err == nil && len(left) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d topics still listed after their deletion: %w", len(left), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Brokers returns the nodes' addresses, node 1 first.
func (c *Cluster) Brokers() []string { return append([]string(nil), c.brokers...) }

// Nodes returns the node numbers, 1 to len(Brokers()).
func (c *Cluster) Nodes() []int {
	n := make([]int, len(c.brokers))
	for i := range n {
		n[i] = i + 1
	}
	return n
}

// Addr returns node's address.
func (c *Cluster) Addr(node int) string { return c.brokers[node-1] }

func (c *Cluster) nodeDir(node int) string { return filepath.Join(c.dir, "node"+strconv.Itoa(node)) }

// Pid returns node's process id, or 0 when it is not running.
func (c *Cluster) Pid(node int) int {
	b, err := os.ReadFile(filepath.Join(c.nodeDir(node), "pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// Running reports whether node's process is alive (stopped counts as alive).
func (c *Cluster) Running(node int) bool { return c.Pid(node) != 0 }

func (c *Cluster) signal(node int, sig syscall.Signal) (int, error) {
	pid := c.Pid(node)
	if pid == 0 {
		return 0, fmt.Errorf("kafkacluster: node %d is not running", node)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return 0, fmt.Errorf("kafkacluster: node %d (pid %d): %w", node, pid, err)
	}
	return pid, nil
}

// Kill SIGKILLs node and waits until its process is gone.
func (c *Cluster) Kill(node int) error {
	pid, err := c.signal(node, syscall.SIGKILL)
	if err != nil {
		return err
	}
	return c.waitGone(node, pid, 30*time.Second)
}

// Terminate stops node gracefully (SIGTERM: it hands over leadership and
// closes its logs) and waits until its process is gone.
func (c *Cluster) Terminate(node int) error {
	pid, err := c.signal(node, syscall.SIGTERM)
	if err != nil {
		return err
	}
	return c.waitGone(node, pid, 2*time.Minute)
}

func (c *Cluster) waitGone(node, pid int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("kafkacluster: node %d (pid %d) still alive %v after the signal", node, pid, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	os.Remove(filepath.Join(c.nodeDir(node), "pid"))
	return nil
}

// Stop SIGSTOPs node: it keeps its connections and answers nothing.
func (c *Cluster) Stop(node int) error { _, err := c.signal(node, syscall.SIGSTOP); return err }

// Cont SIGCONTs a stopped node.
func (c *Cluster) Cont(node int) error { _, err := c.signal(node, syscall.SIGCONT); return err }

// Start starts node again with the start script kafka-up.sh wrote, if it is
// not running, and waits until it accepts connections. It does not wait for
// the node to catch up: WaitHealthy does.
func (c *Cluster) Start(ctx context.Context, node int) error {
	if c.Running(node) {
		return nil
	}
	out, err := exec.CommandContext(ctx, "sh", filepath.Join(c.nodeDir(node), "start.sh")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafkacluster: start node %d: %v: %s", node, err, out)
	}
	for {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addr(node)))
		if err == nil {
			err = cl.Ping(ctx)
			cl.Close()
		}
		if err == nil {
			return nil
		}
		if !c.Running(node) {
			return fmt.Errorf("kafkacluster: node %d exited after start; see %s", node, filepath.Join(c.nodeDir(node), "server.log"))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkacluster: node %d not answering after start: %w", node, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Restore continues stopped nodes, starts killed ones and waits until the
// cluster is whole (WaitHealthy).
func (c *Cluster) Restore(ctx context.Context) error {
	for _, n := range c.Nodes() {
		if c.Running(n) {
			_ = c.Cont(n)
			continue
		}
		if err := c.Start(ctx, n); err != nil {
			return err
		}
	}
	return c.WaitHealthy(ctx)
}

func (c *Cluster) client(extra ...kgo.Opt) (*kgo.Client, error) {
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.brokers...), kgo.RequestRetries(2)}, extra...)
	return kgo.NewClient(opts...)
}

// Partition is one partition's leadership as the cluster reports it.
type Partition struct {
	Topic     string
	Partition int32
	Leader    int // node number; -1 while there is none
	Replicas  []int
	ISR       []int
}

// Partitions returns the partitions of topics (all topics when none given).
func (c *Cluster) Partitions(ctx context.Context, topics ...string) ([]Partition, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	if len(topics) > 0 {
		for _, t := range topics {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
	} else {
		req.Topics = nil // all topics
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: metadata: %w", err)
	}
	var out []Partition
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("kafkacluster: topic %s: %w", deref(t.Topic), err)
		}
		for _, p := range t.Partitions {
			out = append(out, Partition{
				Topic: deref(t.Topic), Partition: p.Partition, Leader: int(p.Leader),
				Replicas: ints(p.Replicas), ISR: ints(p.ISR),
			})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out, nil
}

// Leader returns the node leading topic's partition.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int32) (int, error) {
	ps, err := c.Partitions(ctx, topic)
	if err != nil {
		return 0, err
	}
	for _, p := range ps {
		if p.Partition == partition {
			return p.Leader, nil
		}
	}
	return 0, fmt.Errorf("kafkacluster: %s has no partition %d", topic, partition)
}

// MostLeader returns the node leading the most partitions of topic (the
// lowest number on a tie) and how many it leads.
func (c *Cluster) MostLeader(ctx context.Context, topic string) (node, count int, err error) {
	ps, err := c.Partitions(ctx, topic)
	if err != nil {
		return 0, 0, err
	}
	counts := map[int]int{}
	for _, p := range ps {
		counts[p.Leader]++
	}
	for _, n := range c.Nodes() {
		if counts[n] > count {
			node, count = n, counts[n]
		}
	}
	if node == 0 {
		return 0, 0, fmt.Errorf("kafkacluster: no partition of %s has a leader", topic)
	}
	return node, count, nil
}

// WaitHealthy waits until every node runs, the cluster lists all brokers,
// every partition has a leader and its full replica set in sync, and a
// record produced with acks from all in-sync replicas to a replicated probe
// topic is acknowledged.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var last error
	for {
		last = c.healthy(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkacluster: not healthy: %w", last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *Cluster) healthy(ctx context.Context) error {
	for _, n := range c.Nodes() {
		if !c.Running(n) {
			return fmt.Errorf("node %d is not running", n)
		}
	}
	cl, err := c.client(kgo.RequiredAcks(kgo.AllISRAcks()), kgo.AllowAutoTopicCreation(),
		kgo.ProduceRequestTimeout(5*time.Second), kgo.RecordDeliveryTimeout(10*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(rctx, cl)
	if err != nil {
		return err
	}
	if len(resp.Brokers) < len(c.brokers) {
		return fmt.Errorf("%d of %d brokers registered", len(resp.Brokers), len(c.brokers))
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.Leader < 0 {
				return fmt.Errorf("%s/%d has no leader", deref(t.Topic), p.Partition)
			}
			if len(p.ISR) < len(p.Replicas) {
				return fmt.Errorf("%s/%d: %d of %d replicas in sync", deref(t.Topic), p.Partition, len(p.ISR), len(p.Replicas))
			}
		}
	}
	if err := cl.ProduceSync(rctx, &kgo.Record{Topic: "millrace-probe", Value: []byte("probe")}).FirstErr(); err != nil {
		return fmt.Errorf("probe produce: %w", err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func ints(xs []int32) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}
