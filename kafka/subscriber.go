package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millrace/millrace/core"
)

// Where a consumer group with no committed offset for a partition starts
// reading it: SubscriberConfig.InitialOffset.
const (
	// OffsetOldest starts at the oldest record the partition holds.
	OffsetOldest int64 = -2
	// OffsetNewest starts after the newest record: only records produced
	// from then on are read.
	OffsetNewest int64 = -1
)

// Defaults of SubscriberConfig.
const (
	DefaultFetchMaxWait    = 20 * time.Millisecond
	DefaultMaxBatch        = 500
	DefaultSessionTimeout  = 10 * time.Second
	DefaultCommitInterval  = time.Second
	DefaultNackResendSleep = 100 * time.Millisecond
	DefaultRevokeGrace     = 10 * time.Second
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ConsumerGroup is the Kafka consumer group the Subscriber's members
	// join: each record of a topic goes to one member of the group.
	// Required.
	ConsumerGroup string
	// Unmarshaler turns a record into a message. Defaults to
	// DefaultUnmarshaler(), which reads what Publisher and watermill-kafka's
	// Publisher write: the UUID from the "_watermill_message_uuid" header,
	// the other headers as metadata, the value as payload.
	Unmarshaler Unmarshaler
	// InitialOffset is where the group starts reading a partition it has
	// no committed offset for: OffsetOldest or OffsetNewest. Defaults to
	// OffsetOldest.
	InitialOffset int64
	// FetchMaxWait is the longest a fetch waits on the broker for records
	// to arrive. A broker answers as soon as it has records; this bounds
	// the delay after a paused partition is resumed (a partition pauses
	// while it buffers 2*MaxBatch records, and a fetch already waiting on
	// the others does not take it up again). It is also how often an idle
	// Subscriber's fetch comes back empty, a wake-up of the client and the
	// broker each time: in the bench's saga rig (four Subscribers, the
	// relay, the orchestrator and the participants in one process, the
	// embedded broker in another; two sagas a second) the process and the
	// broker used about 120 ms of CPU a second at 20 ms and about 34 ms at
	// 500 ms, with the same saga latency. A mostly idle service can raise it; one
	// that drains a backlog on some partitions while the others are idle
	// should keep it short. Defaults to DefaultFetchMaxWait (20 ms).
	FetchMaxWait time.Duration
	// MaxBatch is the most records of one partition in one Batch
	// (SubscribeBatch), and half the records a partition buffers before
	// its fetching pauses. Defaults to DefaultMaxBatch (500).
	MaxBatch int
	// SessionTimeout is how long the group's coordinator waits for a
	// member's heartbeat before it gives the member's partitions to the
	// others: how long the partitions of a process that died unannounced
	// (SIGKILL, a lost machine) wait for another member. Defaults to
	// DefaultSessionTimeout (10 s, sarama's and watermill-kafka's default;
	// Kafka's consumers default to 45 s). It must be within the brokers'
	// group.min.session.timeout.ms and group.max.session.timeout.ms (6 s
	// and 30 min by default).
	SessionTimeout time.Duration
	// CommitInterval is how often acknowledged offsets are committed.
	// They are committed too when a partition is revoked and on Close.
	// Defaults to DefaultCommitInterval (1 s).
	CommitInterval time.Duration
	// NackResendSleep is how long a partition waits, after a message of
	// it was nacked, before it delivers the message again. Defaults to
	// DefaultNackResendSleep (100 ms, as watermill-kafka).
	NackResendSleep time.Duration
	// RevokeGrace is how long a partition that the group takes away
	// waits for the messages delivered from it to be acked or nacked,
	// so that their offsets are committed before the next owner reads
	// it; what is not acknowledged by then is delivered again to the
	// next owner. It must be shorter than the rebalance timeout (60 s
	// unless ClientOptions set kgo.RebalanceTimeout). Defaults to
	// DefaultRevokeGrace (10 s).
	RevokeGrace time.Duration
	// ClientOptions are extra franz-go options (TLS, SASL, ...), applied
	// after the Subscriber's defaults. The options the Subscriber relies
	// on are applied last and cannot be overridden: the consumer group
	// and topic, the cooperative-sticky balancer, manual commits and the
	// partition callbacks.
	ClientOptions []kgo.Opt
}

func (c *SubscriberConfig) setDefaults() {
	if c.Unmarshaler == nil {
		c.Unmarshaler = DefaultUnmarshaler()
	}
	if c.InitialOffset == 0 {
		c.InitialOffset = OffsetOldest
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.NackResendSleep == 0 {
		c.NackResendSleep = DefaultNackResendSleep
	}
	if c.RevokeGrace == 0 {
		c.RevokeGrace = DefaultRevokeGrace
	}
}

func (c *SubscriberConfig) validate() error {
	if len(c.Brokers) == 0 {
		return fmt.Errorf("%w: kafka: SubscriberConfig.Brokers is empty", core.ErrConfig)
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return fmt.Errorf("%w: kafka: empty address in SubscriberConfig.Brokers %q", core.ErrConfig, c.Brokers)
		}
	}
	if c.ConsumerGroup == "" {
		return fmt.Errorf("%w: kafka: SubscriberConfig.ConsumerGroup is required", core.ErrConfig)
	}
	if c.InitialOffset != OffsetOldest && c.InitialOffset != OffsetNewest {
		return fmt.Errorf("%w: kafka: SubscriberConfig.InitialOffset must be OffsetOldest or OffsetNewest, got %d", core.ErrConfig, c.InitialOffset)
	}
	if c.FetchMaxWait < 0 || c.MaxBatch < 0 || c.SessionTimeout < 0 || c.CommitInterval < 0 || c.NackResendSleep < 0 || c.RevokeGrace < 0 {
		return fmt.Errorf("%w: kafka: SubscriberConfig durations and MaxBatch must not be negative", core.ErrConfig)
	}
	return nil
}

// Subscriber is a Watermill message.Subscriber for Kafka consumer groups on
// franz-go. Each Subscribe or SubscribeBatch call joins the group as a
// member of its own, consuming one topic with cooperative-sticky
// rebalancing; it joins once every broker knows the topic (creating it
// where the cluster creates topics on first use), so a topic just created
// is not balanced to no one by a leader whose broker has not heard of it.
// Offsets are committed only for messages acknowledged in order: per
// partition, the committed offset never passes a message that was nacked
// or not yet acked. A nacked message is delivered again, and
// with it every message after it in its partition.
//
// Subscribe delivers one message per partition at a time (the next one
// after the previous is acked), as watermill-kafka's subscriber does.
// SubscribeBatch delivers up to MaxBatch records of a partition at once as
// a Batch. It is safe for concurrent use.
type Subscriber struct {
	cfg    SubscriberConfig
	logger watermill.LoggerAdapter

	mu     sync.Mutex
	closed bool
	subs   map[*subscription]struct{}
	wg     sync.WaitGroup
}

// NewSubscriber checks cfg, connects to the brokers and returns a
// Subscriber. A nil logger logs to slog.Default(). Errors for a bad cfg
// wrap core.ErrConfig; a broker that does not answer is an error too.
func NewSubscriber(cfg SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Brokers = append([]string(nil), cfg.Brokers...)
	if logger == nil {
		logger = watermill.NewSlogLogger(slog.Default())
	}
	s := &Subscriber{cfg: cfg, logger: logger, subs: map[*subscription]struct{}{}}
	probe, err := kgo.NewClient(s.clientOpts()...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: client options: %w", core.ErrConfig, err)
	}
	defer probe.Close()
	dial, _ := probe.OptValue(kgo.DialTimeout).(time.Duration)
	ctx, cancel := context.WithTimeout(context.Background(), max(dial, time.Second))
	defer cancel()
	if err := probe.Ping(ctx); err != nil {
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	return s, nil
}

func (s *Subscriber) clientOpts() []kgo.Opt {
	return append([]kgo.Opt{
		kgo.SeedBrokers(s.cfg.Brokers...),
		kgo.ClientID("millrace"),
		kgo.DialTimeout(10 * time.Second),
		kgo.MetadataMinAge(time.Second),
		// A topic subscribed to before anything is published to it is
		// created, so that consuming starts at once.
		kgo.AllowAutoTopicCreation(),
		kgo.FetchMaxWait(s.cfg.FetchMaxWait),
		kgo.SessionTimeout(s.cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, s.cfg.SessionTimeout/3)),
	}, s.cfg.ClientOptions...)
}

// Subscribe joins the consumer group for topic and returns its messages,
// one per partition at a time: a partition's next message comes after the
// previous one is acked; a nacked one comes again after NackResendSleep.
// The channel closes when ctx ends or the Subscriber closes; a message's
// context is ctx's, with the record's partition, offset, timestamp and key
// (RecordFromContext), and is cancelled once the message is
// acked or nacked, or its partition is taken away, or the subscription
// ends.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	if err := s.start(ctx, topic, 1, func(d *delivery) (chan<- *message.Message, *message.Message) { return out, d.msgs[0] }, nil, func() { close(out) }); err != nil {
		return nil, err
	}
	return out, nil
}

// Subscriber delivers batches (SubscribeBatch) to the batched consumers.
var _ core.BatchSubscriber = (*Subscriber)(nil)

// SubscribeBatch is Subscribe, but delivers many records of a partition at
// once: whatever the partition has buffered, up to MaxBatch, as one
// core.Batch, its messages in offset order (each message's context carries
// its offset: RecordFromContext). A partition has one Batch in
// flight at a time; batches of different partitions come concurrently.
// Once each message of a Batch is acked or nacked, the partition goes on:
// committed up to the first nacked message, and delivering again from it
// (with all the messages after it, acked or not) after NackResendSleep.
// The channel closes when ctx ends or the Subscriber closes.
func (s *Subscriber) SubscribeBatch(ctx context.Context, topic string) (<-chan *core.Batch, error) {
	out := make(chan *core.Batch)
	if err := s.start(ctx, topic, s.cfg.MaxBatch, nil, func(d *delivery) (chan<- *core.Batch, *core.Batch) {
		return out, &core.Batch{Topic: topic, Partition: d.part, Messages: d.msgs}
	}, func() { close(out) }); err != nil {
		return nil, err
	}
	return out, nil
}

// Close ends every subscription: deliveries stop, the contexts of messages
// not yet acknowledged are cancelled, acknowledged offsets are committed
// and the members leave the group. It waits for all of that. Closing twice
// is a no-op.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	subs := make([]*subscription, 0, len(s.subs))
	for sub := range s.subs {
		subs = append(subs, sub)
	}
	s.mu.Unlock()
	for _, sub := range subs {
		sub.cancel()
	}
	s.wg.Wait()
	return nil
}

// subscription is one member of the group, consuming one topic.
type subscription struct {
	s       *Subscriber
	topic   string
	ctx     context.Context // the Subscribe call's, ended by Close too
	cancel  context.CancelFunc
	client  *kgo.Client
	maxRecs int // records per delivery
	deliver func(ctx context.Context, d *delivery) bool

	mu    sync.Mutex
	parts map[int32]*partition

	commitMu sync.Mutex // one commit at a time, revokes included
}

func (s *Subscriber) start(ctx context.Context, topic string, maxRecs int,
	one func(*delivery) (chan<- *message.Message, *message.Message),
	batch func(*delivery) (chan<- *core.Batch, *core.Batch),
	done func(),
) error {
	if topic == "" {
		return fmt.Errorf("%w: kafka: empty topic", ErrInvalidTopic)
	}
	ctx, cancel := context.WithCancel(ctx)
	sub := &subscription{s: s, topic: topic, ctx: ctx, cancel: cancel, maxRecs: maxRecs, parts: map[int32]*partition{}}
	switch {
	case one != nil:
		sub.deliver = func(stop context.Context, d *delivery) bool {
			ch, m := one(d)
			select {
			case ch <- m:
				return true
			case <-stop.Done():
				return false
			}
		}
	default:
		sub.deliver = func(stop context.Context, d *delivery) bool {
			ch, b := batch(d)
			select {
			case ch <- b:
				return true
			case <-stop.Done():
				return false
			}
		}
	}
	reset := kgo.NewOffset().AtStart()
	if s.cfg.InitialOffset == OffsetNewest {
		reset = kgo.NewOffset().AtEnd()
	}
	opts := append(s.clientOpts(),
		// No topic yet: run adds it once every broker knows it
		// (awaitTopic).
		kgo.ConsumerGroup(s.cfg.ConsumerGroup),
		kgo.ConsumeResetOffset(reset),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(sub.onAssigned),
		kgo.OnPartitionsRevoked(sub.onRevoked),
		kgo.OnPartitionsLost(sub.onLost),
	)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		cancel()
		return ErrClosed
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		cancel()
		return fmt.Errorf("%w: kafka: client options: %w", core.ErrConfig, err)
	}
	sub.client = client
	s.subs[sub] = struct{}{}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		sub.run()
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
		done()
	}()
	return nil
}

// run polls and hands the records to their partitions until the
// subscription ends, then stops the partitions, commits and leaves.
func (sub *subscription) run() {
	if sub.awaitTopic() {
		sub.client.AddConsumeTopics(sub.topic)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sub.commitLoop()
	}()
	for {
		fs := sub.client.PollRecords(sub.ctx, 10_000)
		if fs.IsClientClosed() || sub.ctx.Err() != nil {
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				sub.s.logger.Error("Kafka fetch failed", err, watermill.LogFields{"topic": topic, "partition": p})
			}
		})
		fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
			if len(ftp.Records) > 0 {
				sub.route(ftp.Partition, ftp.Records)
			}
		})
	}
	wg.Wait()
	sub.mu.Lock()
	parts := make([]*partition, 0, len(sub.parts))
	for id, p := range sub.parts {
		parts = append(parts, p)
		delete(sub.parts, id)
	}
	sub.mu.Unlock()
	for _, p := range parts {
		p.hardStop()
	}
	for _, p := range parts {
		<-p.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	sub.commit(ctx, parts)
	cancel()
	sub.client.Close() // leaves the group
}

// awaitTopic waits until every broker that answers knows the topic
// (asking for it creates it where the cluster creates topics on first
// use), so that the member joins the group only then. It returns false
// when the subscription ends first. The subscriptions of a Subscriber are
// members of one group, each with its own topic, so the group's leader
// asks some broker for the partitions of topics other members consume; if
// that broker has not heard of a new topic yet, the leader assigns it to
// no member and does not balance again until the group's membership
// changes: a member that joined as soon as its own broker knew the topic
// waited for partitions that never came (a three-node cluster, a
// Service's reply and command topics, both new). A topic that does not
// exist yet is waited for, as a member of it would wait, and said so
// after a while.
func (sub *subscription) awaitTopic() bool {
	start := time.Now()
	said := false
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		missing, err := sub.brokersMissingTopic()
		if err == nil && len(missing) == 0 {
			if said {
				sub.s.logger.Info("Kafka topic known to every broker, joining the consumer group",
					watermill.LogFields{"topic": sub.topic, "consumer_group": sub.s.cfg.ConsumerGroup})
			}
			return true
		}
		if !said && time.Since(start) > 10*time.Second {
			said = true
			if err == nil {
				err = fmt.Errorf("brokers %v do not know it yet", missing)
			}
			sub.s.logger.Error("Kafka topic not known to every broker yet: the subscription waits for it before joining the consumer group", err,
				watermill.LogFields{"topic": sub.topic, "consumer_group": sub.s.cfg.ConsumerGroup})
		}
		select {
		case <-sub.ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// brokersMissingTopic asks the cluster for the topic (allowing its
// creation) and then each of its brokers for it, and returns the brokers
// that answer without it (an error, or no partitions). A broker that
// does not answer is left out: it learns the topic when it comes back,
// before it answers anyone.
func (sub *subscription) brokersMissingTopic() ([]int32, error) {
	ctx, cancel := context.WithTimeout(sub.ctx, 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(sub.topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = true
	resp, err := req.RequestWith(ctx, sub.client)
	if err != nil {
		return nil, err
	}
	if err := topicIn(resp, sub.topic); err != nil {
		return nil, err
	}
	req.AllowAutoTopicCreation = false
	var missing []int32
	for _, b := range resp.Brokers {
		one, err := req.RequestWith(ctx, sub.client.Broker(int(b.NodeID)))
		if err != nil {
			continue
		}
		if topicIn(one, sub.topic) != nil {
			missing = append(missing, b.NodeID)
		}
	}
	return missing, nil
}

// topicIn says whether a metadata response has topic with partitions.
func topicIn(resp *kmsg.MetadataResponse, topic string) error {
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return err
		}
		if len(t.Partitions) == 0 {
			return errors.New("no partitions")
		}
		return nil
	}
	return errors.New("not in the metadata")
}

func (sub *subscription) route(id int32, recs []*kgo.Record) {
	sub.mu.Lock()
	p := sub.parts[id]
	sub.mu.Unlock()
	if p == nil {
		return // revoked while the fetch was on its way
	}
	p.add(recs)
}

// commitLoop commits acknowledged offsets every CommitInterval.
func (sub *subscription) commitLoop() {
	t := time.NewTicker(sub.s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-sub.ctx.Done():
			return
		case <-t.C:
		}
		sub.mu.Lock()
		parts := make([]*partition, 0, len(sub.parts))
		for _, p := range sub.parts {
			parts = append(parts, p)
		}
		sub.mu.Unlock()
		sub.commit(sub.ctx, parts)
	}
}

// commit commits the acknowledged offsets of parts that moved since their
// last commit. A failure is logged; those offsets go out again next time.
func (sub *subscription) commit(ctx context.Context, parts []*partition) {
	sub.commitMu.Lock()
	defer sub.commitMu.Unlock()
	offsets := map[int32]kgo.EpochOffset{}
	byID := map[int32]*partition{}
	for _, p := range parts {
		if eo, ok := p.toCommit(); ok {
			offsets[p.id], byID[p.id] = eo, p
		}
	}
	if len(offsets) == 0 {
		return
	}
	var failed error
	sub.client.CommitOffsetsSync(ctx, map[string]map[int32]kgo.EpochOffset{sub.topic: offsets},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			if err != nil {
				failed = err
				return
			}
			for _, t := range resp.Topics {
				for _, rp := range t.Partitions {
					p := byID[rp.Partition]
					if p == nil {
						continue
					}
					if rp.ErrorCode != 0 {
						if failed == nil {
							failed = fmt.Errorf("partition %d: %w", rp.Partition, kerr.ErrorForCode(rp.ErrorCode))
						}
						continue
					}
					p.committed(offsets[rp.Partition].Offset)
				}
			}
		})
	if failed != nil && ctx.Err() == nil {
		sub.s.logger.Error("Kafka offset commit failed; committing again later", failed,
			watermill.LogFields{"topic": sub.topic, "consumer_group": sub.s.cfg.ConsumerGroup})
	}
}

func (sub *subscription) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.ctx.Err() != nil {
		return
	}
	for _, id := range assigned[sub.topic] {
		if sub.parts[id] != nil {
			continue
		}
		p := newPartition(sub, id)
		sub.parts[id] = p
		go p.run()
	}
}

// onRevoked lets the revoked partitions' deliveries in flight finish (up
// to RevokeGrace), commits what was acknowledged and drops the rest: the
// next owner reads it from the committed offset.
func (sub *subscription) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	parts := sub.take(revoked[sub.topic])
	if len(parts) == 0 {
		return
	}
	for _, p := range parts {
		p.softStop()
	}
	grace := time.NewTimer(sub.s.cfg.RevokeGrace)
	defer grace.Stop()
	for _, p := range parts {
		select {
		case <-p.done:
		case <-grace.C:
			for _, q := range parts {
				q.hardStop()
			}
			<-p.done
		case <-sub.ctx.Done():
			for _, q := range parts {
				q.hardStop()
			}
			<-p.done
		}
	}
	for _, p := range parts {
		p.hardStop()
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	sub.commit(cctx, parts)
	cancel()
	sub.resume(parts)
}

// onLost drops the partitions without committing: the group has already
// given them to another member.
func (sub *subscription) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	parts := sub.take(lost[sub.topic])
	for _, p := range parts {
		p.hardStop()
	}
	for _, p := range parts {
		<-p.done
	}
	sub.resume(parts)
}

func (sub *subscription) take(ids []int32) []*partition {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	var parts []*partition
	for _, id := range ids {
		if p := sub.parts[id]; p != nil {
			parts = append(parts, p)
			delete(sub.parts, id)
		}
	}
	return parts
}

// resume lifts the pause of partitions that leave, so that they are
// fetched again should they come back.
func (sub *subscription) resume(parts []*partition) {
	var ids []int32
	for _, p := range parts {
		ids = append(ids, p.id)
	}
	sub.client.ResumeFetchPartitions(map[string][]int32{sub.topic: ids})
}

// partition delivers one partition's records in order and tracks which
// offset may be committed.
type partition struct {
	sub       *subscription
	id        int32
	maxBuffer int // records queued before fetching pauses

	mu     sync.Mutex
	queue  []*kgo.Record // fetched, not delivered
	next   int64         // offset after the last record queued; -1 before the first
	paused bool
	acked  int64 // offset after the acknowledged prefix; -1 when nothing was acked
	epoch  int32 // leader epoch of the last acknowledged record
	sent   int64 // offset last committed; -1 before the first commit

	wake     chan struct{}
	soft     context.Context // ended: deliver nothing more
	softStop context.CancelFunc
	hard     context.Context // ended: stop waiting for acknowledgements too
	hardStop context.CancelFunc
	done     chan struct{}
}

func newPartition(sub *subscription, id int32) *partition {
	p := &partition{
		sub: sub, id: id, maxBuffer: 2 * sub.s.cfg.MaxBatch, next: -1, acked: -1, sent: -1,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	p.hard, p.hardStop = context.WithCancel(sub.ctx)
	p.soft, p.softStop = context.WithCancel(p.hard)
	return p
}

func (p *partition) add(recs []*kgo.Record) {
	p.mu.Lock()
	for _, r := range recs {
		if r.Offset < p.next {
			continue // fetched again after a rewind of the client's
		}
		p.queue = append(p.queue, r)
		p.next = r.Offset + 1
	}
	pause := !p.paused && len(p.queue) >= p.maxBuffer
	if pause {
		p.paused = true
	}
	p.mu.Unlock()
	if pause {
		p.sub.client.PauseFetchPartitions(map[string][]int32{p.sub.topic: {p.id}})
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// takeRecords removes up to n records from the head of the queue.
func (p *partition) takeRecords(n int) []*kgo.Record {
	p.mu.Lock()
	n = min(n, len(p.queue))
	recs := append([]*kgo.Record(nil), p.queue[:n]...)
	p.queue = p.queue[n:]
	resume := p.paused && len(p.queue) <= p.maxBuffer/2
	if resume {
		p.paused = false
	}
	p.mu.Unlock()
	if resume {
		p.sub.client.ResumeFetchPartitions(map[string][]int32{p.sub.topic: {p.id}})
	}
	return recs
}

// putBack returns records to the head of the queue, to be delivered again.
func (p *partition) putBack(recs []*kgo.Record) {
	p.mu.Lock()
	p.queue = append(recs[:len(recs):len(recs)], p.queue...)
	p.mu.Unlock()
}

func (p *partition) ackedUpTo(r *kgo.Record) {
	p.mu.Lock()
	if r.Offset+1 > p.acked {
		p.acked, p.epoch = r.Offset+1, r.LeaderEpoch
	}
	p.mu.Unlock()
}

func (p *partition) toCommit() (kgo.EpochOffset, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.acked < 0 || p.acked <= p.sent {
		return kgo.EpochOffset{}, false
	}
	return kgo.EpochOffset{Epoch: p.epoch, Offset: p.acked}, true
}

func (p *partition) committed(off int64) {
	p.mu.Lock()
	p.sent = max(p.sent, off)
	p.mu.Unlock()
}

func (p *partition) run() {
	defer close(p.done)
	for p.soft.Err() == nil {
		recs := p.takeRecords(p.sub.maxRecs)
		if len(recs) == 0 {
			select {
			case <-p.wake:
			case <-p.soft.Done():
			}
			continue
		}
		d := p.newDelivery(recs)
		if len(d.msgs) == 0 {
			continue // every record skipped
		}
		if !p.sub.deliver(p.soft, d) {
			d.cancelAll()
			return
		}
		nacked := p.await(d)
		if nacked < 0 {
			continue
		}
		var again []*kgo.Record
		for _, e := range d.entries[nacked:] {
			again = append(again, e.rec)
		}
		p.putBack(again)
		select {
		case <-time.After(p.sub.s.cfg.NackResendSleep):
		case <-p.soft.Done():
		}
	}
}

// await waits until every message of d is acked or nacked, or the partition
// is stopped hard, and records the acknowledged prefix. It returns the index
// of the first entry not acked (nacked, or pending at a hard stop), or -1.
func (p *partition) await(d *delivery) int {
	defer d.cancelAll()
	first := -1
	for i, e := range d.entries {
		if e.msg == nil { // skipped: passes once everything before it is acked
			if first < 0 {
				p.ackedUpTo(e.rec)
			}
			continue
		}
		select {
		case <-e.msg.Acked():
			if first < 0 {
				p.ackedUpTo(e.rec)
			}
		case <-e.msg.Nacked():
			if first < 0 {
				first = i
			}
		case <-p.hard.Done():
			// Take the acks that came in, up to the first gap.
			for j := i; j < len(d.entries) && first < 0; j++ {
				if m := d.entries[j].msg; m != nil {
					select {
					case <-m.Acked():
					default:
						first = j
						continue
					}
				}
				p.ackedUpTo(d.entries[j].rec)
			}
			return first
		}
	}
	return first
}

// delivery is the records of a partition handed out at once.
type delivery struct {
	part    int32
	entries []entry
	msgs    []*message.Message // the entries' messages, skipped ones left out
	cancels []context.CancelFunc
}

// entry is one record of a delivery and its message; msg is nil for a
// record the Unmarshaler refused.
type entry struct {
	rec *kgo.Record
	msg *message.Message
}

func (d *delivery) cancelAll() {
	for _, c := range d.cancels {
		c()
	}
}

// newDelivery unmarshals recs. A record the Unmarshaler refuses is logged
// and skipped: passed like an acked message. One without a message UUID
// gets recordUUID's, the same each time it is delivered.
func (p *partition) newDelivery(recs []*kgo.Record) *delivery {
	d := &delivery{part: p.id}
	for _, r := range recs {
		msg, err := p.sub.s.cfg.Unmarshaler.Unmarshal(r)
		if err != nil || msg == nil {
			if err == nil {
				err = errors.New("no message")
			}
			p.sub.s.logger.Error("Kafka record skipped: the Unmarshaler refused it", err, watermill.LogFields{
				"topic": r.Topic, "partition": r.Partition, "offset": r.Offset,
			})
			if len(d.msgs) == 0 {
				p.ackedUpTo(r) // nothing before it waits for an ack
			} else {
				d.entries = append(d.entries, entry{rec: r})
			}
			continue
		}
		if msg.UUID == "" {
			msg.UUID = recordUUID(r.Topic, r.Partition, r.Offset)
		}
		ctx, cancel := context.WithCancel(context.WithValue(p.sub.ctx, recordKey{}, r))
		msg.SetContext(ctx)
		d.cancels = append(d.cancels, cancel)
		d.entries = append(d.entries, entry{rec: r, msg: msg})
		d.msgs = append(d.msgs, msg)
	}
	return d
}

// recordNamespace is the namespace of recordUUID's name-based UUIDs.
var recordNamespace = uuid.MustParse("5b1e0c1e-6f0a-4a8e-9a57-6d696c6c7261")

// recordUUID returns the UUID a Subscriber gives a record that carries none
// (no "_watermill_message_uuid" header, or an empty one): a name-based
// (version 5) UUID of its topic, partition and offset, the same on every
// delivery of the record.
func recordUUID(topic string, partition int32, offset int64) string {
	return uuid.NewSHA1(recordNamespace, fmt.Appendf(nil, "%s/%d/%d", topic, partition, offset)).String()
}

// recordKey is the context key of a delivered message's record: one
// value for its partition, offset, timestamp and key (four values took
// four contexts and the allocations of their boxes, per message).
type recordKey struct{}

// RecordFromContext returns the record a Subscriber delivered as the
// message of ctx (msg.Context()): its partition, offset, timestamp, key
// (for what Publisher writes with DefaultMarshaler, the message's
// core.MetadataPartitionKey) and headers. Treat it as read-only. It reads
// only this package's Subscriber's messages: for watermill-kafka's
// subscriber, use its own accessors.
func RecordFromContext(ctx context.Context) (*kgo.Record, bool) {
	r, ok := ctx.Value(recordKey{}).(*kgo.Record)
	return r, ok
}
