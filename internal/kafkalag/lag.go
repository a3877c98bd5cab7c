// Package kafkalag reads Kafka consumer groups' lag per partition, and the
// age of each partition's oldest unconsumed record: the console's and the
// millrace command's lag pages, and the lag gauges a Service registers
// with its metrics.
package kafkalag

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/kafka"
)

// Config configures a Reader.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Groups are the consumer groups to read. Defaults to every group the
	// cluster lists.
	Groups []string
	// StallAfter is how old a partition's oldest unconsumed record may get
	// before the partition is reported stalled: records wait there and
	// nobody takes them (no member holds the partition, or the one that
	// holds it is dead or stuck). Defaults to 1 minute.
	StallAfter time.Duration
	// Timeout bounds one Read, including the fetch of each lagging
	// partition's oldest unconsumed record. Defaults to 10 seconds.
	Timeout time.Duration
}

// Partition is one consumer group's position on one partition.
type Partition struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Committed is the group's committed offset: the next record it will
	// consume. -1 when the group never committed on the partition (it
	// then starts where its reset policy says; the lag is counted from
	// the partition's start).
	Committed int64 `json:"committed"`
	// End is the partition's end offset (the next record to be written).
	End int64 `json:"end"`
	// Lag is how many records wait: End minus Committed.
	Lag int64 `json:"lag"`
	// Member is the member that holds the partition (its client id and
	// host), "" when no member does: nobody consumes it.
	Member string `json:"member"`
	// OldestAge is how long ago the oldest unconsumed record was written;
	// zero when nothing waits.
	OldestAge time.Duration `json:"oldest_age_ns"`
	// Stalled is set when records wait and the oldest of them is older
	// than StallAfter: the lag grows while the offset does not move.
	Stalled bool `json:"stalled"`
	// Err is what kept the figures from being read, "" when nothing did.
	Err string `json:"error,omitempty"`
}

// Reader reads consumer groups' lag per partition, and the age of each
// partition's oldest unconsumed record, from the cluster: what shows that
// a participant's partitions are not consumed (a dead group member, a
// crashed service) before its sagas' steps time out. Collector exports the
// same figures as Prometheus gauges. It is safe for concurrent use; Close
// it when done.
type Reader struct {
	cfg Config
	cl  *kgo.Client
	adm *kadm.Client
}

// ErrNoGroups is returned by Read when the cluster has no consumer group
// (and Config.Groups names none).
var ErrNoGroups = errors.New("kafkalag: no consumer groups")

// New returns a Reader for cfg. Configuration errors wrap
// core.ErrConfig.
func New(cfg Config) (*Reader, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: kafka: Config.Brokers is required", core.ErrConfig)
	}
	if cfg.StallAfter < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: kafka: Config.StallAfter and Timeout must not be negative", core.ErrConfig)
	}
	if cfg.StallAfter == 0 {
		cfg.StallAfter = time.Minute
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.Brokers...), kgo.DialTimeout(5*time.Second))
	if err != nil {
		return nil, fmt.Errorf("kafkalag: client: %w", err)
	}
	return &Reader{cfg: cfg, cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the reader's connections.
func (r *Reader) Close() { r.cl.Close() }

// Read returns every partition of every topic the groups committed on,
// sorted by group, topic and partition. A group whose figures cannot be
// read is returned with Err set on its partitions when it has some, or as
// an error when nothing could be read at all.
func (r *Reader) Read(ctx context.Context) ([]Partition, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	return r.read(ctx, nil)
}

// read is Read of the partitions keep keeps (all with keep nil): the ages
// are read only for those.
func (r *Reader) read(ctx context.Context, keep func(topic string, p int32) bool) ([]Partition, error) {
	lags, err := r.adm.Lag(ctx, r.cfg.Groups...)
	if err != nil && len(lags) == 0 {
		return nil, fmt.Errorf("kafka: read group lag: %w", err)
	}
	if len(lags) == 0 {
		return nil, ErrNoGroups
	}
	var out []Partition
	var groupErrs error
	for _, g := range lags {
		if gerr := g.Error(); gerr != nil && len(g.Lag) == 0 {
			groupErrs = errors.Join(groupErrs, fmt.Errorf("group %s: %w", g.Group, gerr))
			continue
		}
		for _, l := range g.Lag.Sorted() {
			if keep != nil && !keep(l.Topic, l.Partition) {
				continue
			}
			p := Partition{Group: g.Group, Topic: l.Topic, Partition: l.Partition,
				Committed: l.Commit.At, End: l.End.Offset, Lag: l.Lag}
			if l.Member != nil {
				p.Member = l.Member.ClientID + "@" + l.Member.ClientHost
			}
			if l.Err != nil {
				p.Err = l.Err.Error()
			}
			out = append(out, p)
		}
	}
	if len(out) == 0 && groupErrs != nil {
		return nil, fmt.Errorf("kafka: read group lag: %w", groupErrs)
	}
	if err := r.ages(ctx, out); err != nil {
		return out, err
	}
	slices.SortFunc(out, func(a, b Partition) int {
		if a.Group != b.Group {
			return cmp.Compare(a.Group, b.Group)
		}
		if a.Topic != b.Topic {
			return cmp.Compare(a.Topic, b.Topic)
		}
		return int(a.Partition - b.Partition)
	})
	return out, nil
}

// ages fills OldestAge and Stalled of the lagging partitions: it reads the
// record at each one's committed offset (or the partition's start, without
// a commit) through short-lived consumers, one per round of distinct
// offsets (several groups on one partition at different offsets need a
// round each; one group per topic, the usual case, needs one).
func (r *Reader) ages(ctx context.Context, lags []Partition) error {
	want := map[lagTP][]int64{} // distinct waiting offsets of each partition
	for _, l := range lags {
		if l.Lag <= 0 || l.Err != "" {
			continue
		}
		k := lagTP{l.Topic, l.Partition}
		if at := oldestWaiting(l); !slices.Contains(want[k], at) {
			want[k] = append(want[k], at)
		}
	}
	stamps := map[lagTP]map[int64]time.Time{}
	for round := 0; ; round++ {
		parts := map[string]map[int32]kgo.Offset{}
		at := map[lagTP]int64{}
		for k, offs := range want {
			if round >= len(offs) {
				continue
			}
			if parts[k.topic] == nil {
				parts[k.topic] = map[int32]kgo.Offset{}
			}
			parts[k.topic][k.p] = kgo.NewOffset().At(offs[round])
			at[k] = offs[round]
		}
		if len(at) == 0 {
			break
		}
		if err := r.firstRecords(ctx, parts, at, stamps); err != nil {
			return err
		}
	}
	now := time.Now()
	for i := range lags {
		l := &lags[i]
		if l.Lag <= 0 || l.Err != "" {
			continue
		}
		ts, ok := stamps[lagTP{l.Topic, l.Partition}][oldestWaiting(*l)]
		if !ok {
			l.Err = "the oldest unconsumed record could not be read within the timeout"
			continue
		}
		l.OldestAge = max(now.Sub(ts), 0)
		l.Stalled = l.OldestAge > r.cfg.StallAfter
	}
	return nil
}

type lagTP struct {
	topic string
	p     int32
}

// oldestWaiting is the offset of l's oldest unconsumed record.
func oldestWaiting(l Partition) int64 {
	if l.Committed < 0 {
		return l.End - l.Lag
	}
	return l.Committed
}

// firstRecords reads, for each partition in at, the timestamp of the
// first record at or after its offset (past a compacted or control
// record) into stamps, until all are read or ctx ends.
func (r *Reader) firstRecords(ctx context.Context, parts map[string]map[int32]kgo.Offset, at map[lagTP]int64, stamps map[lagTP]map[int64]time.Time) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.cfg.Brokers...), kgo.DialTimeout(5*time.Second),
		kgo.ConsumePartitions(parts), kgo.FetchMaxPartitionBytes(64<<10), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("kafka: lag: oldest records: %w", err)
	}
	defer cl.Close()
	for found := 0; found < len(at) && ctx.Err() == nil; {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			k := lagTP{rec.Topic, rec.Partition}
			off, ok := at[k]
			if !ok || rec.Offset < off {
				return
			}
			if stamps[k] == nil {
				stamps[k] = map[int64]time.Time{}
			}
			if _, seen := stamps[k][off]; !seen {
				stamps[k][off] = rec.Timestamp
				found++
			}
		})
	}
	return nil
}

// Collector returns a Prometheus collector that reads the lag on every
// scrape and exports, per group, topic and partition:
//
//	millrace_kafka_consumer_lag                  records waiting
//	millrace_kafka_consumer_oldest_age_seconds   age of the oldest of them
//	millrace_kafka_consumer_stalled              1 when the partition is stalled
//	millrace_kafka_consumer_assigned             1 when a member holds it
//
// and millrace_kafka_lag_read_errors_total. A scrape reads the cluster:
// scrape it every 15 seconds or more.
func (r *Reader) Collector() prometheus.Collector {
	labels := []string{"group", "topic", "partition"}
	return &lagCollector{r: r,
		lag:      prometheus.NewDesc("millrace_kafka_consumer_lag", "Records of the partition the consumer group has not consumed yet.", labels, nil),
		age:      prometheus.NewDesc("millrace_kafka_consumer_oldest_age_seconds", "Age of the oldest record of the partition the consumer group has not consumed; 0 when none waits.", labels, nil),
		stalled:  prometheus.NewDesc("millrace_kafka_consumer_stalled", "1 when records of the partition wait longer than StallAfter: nobody consumes them.", labels, nil),
		assigned: prometheus.NewDesc("millrace_kafka_consumer_assigned", "1 when a member of the group holds the partition.", labels, nil),
		errors:   prometheus.NewCounter(prometheus.CounterOpts{Name: "millrace_kafka_lag_read_errors_total", Help: "Reads of the consumer groups' lag that failed."}),
	}
}

type lagCollector struct {
	r                           *Reader
	lag, age, stalled, assigned *prometheus.Desc
	errors                      prometheus.Counter
	mu                          sync.Mutex // one read at a time
}

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.age
	ch <- c.stalled
	ch <- c.assigned
	c.errors.Describe(ch)
}

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	lags, err := c.r.Read(context.Background())
	c.mu.Unlock()
	if err != nil && !errors.Is(err, ErrNoGroups) {
		c.errors.Inc()
	}
	for _, l := range lags {
		if l.Err != "" && l.Lag < 0 {
			continue
		}
		lv := []string{l.Group, l.Topic, strconv.Itoa(int(l.Partition))}
		ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(max(l.Lag, 0)), lv...)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, l.OldestAge.Seconds(), lv...)
		ch <- prometheus.MustNewConstMetric(c.stalled, prometheus.GaugeValue, b2f(l.Stalled), lv...)
		ch <- prometheus.MustNewConstMetric(c.assigned, prometheus.GaugeValue, b2f(l.Member != ""), lv...)
	}
	c.errors.Collect(ch)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ForKey returns the lag of every group on the partition of topic that
// key is sent to (KeyPartition): where a saga's command waits, say. Only
// groups that consume the topic are returned.
func (r *Reader) ForKey(ctx context.Context, topic, key string) ([]Partition, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	topics, err := r.adm.ListTopics(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: topic %s: %w", topic, err)
	}
	td, ok := topics[topic]
	if !ok || td.Err != nil || len(td.Partitions) == 0 {
		return nil, fmt.Errorf("kafka: topic %s: not found", topic)
	}
	p := kafka.KeyPartition(key, int32(len(td.Partitions)))
	return r.read(ctx, func(t string, q int32) bool { return t == topic && q == p })
}
