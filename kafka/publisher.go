package kafka

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/logging"
)

// Errors returned by NewPublisher and Publish. Test for them with errors.Is.
var (
	// ErrClosed is the error of every message published after the
	// Publisher's Close (temporary), and of Subscribe and SubscribeBatch
	// after the Subscriber's.
	ErrClosed = errors.New("kafka: closed")
	// ErrMarshal is the error of a message the Marshaler refused (for
	// example one whose metadata uses the reserved
	// "_watermill_message_uuid" key). Such a message was not sent; the
	// error is permanent.
	ErrMarshal = errors.New("kafka: cannot marshal message")
	// ErrMessageTooLarge is the error of a message larger than its topic
	// accepts (the topic's max.message.bytes, or MaxMessageBytes if lower).
	// It is permanent.
	ErrMessageTooLarge = errors.New("kafka: message too large")
	// ErrHeldBack is the error of a message not sent, or failed with the
	// rest of its partition, because an earlier message of the same record
	// key in the same Publish call failed (or one of its topic that the
	// Marshaler refused without saying its key); storing it would have put
	// it ahead of that message. It is temporary: it goes out once the
	// failed message is dealt with.
	ErrHeldBack = errors.New("kafka: held back behind a failed message of the same key")
)

// DefaultMaxMessageBytes is the default of PublisherConfig.MaxMessageBytes:
// franz-go's default record batch limit, a little under Kafka's default
// max.message.bytes (1048588).
const DefaultMaxMessageBytes = 1_000_012

// DefaultDeliveryTimeout is how long a record may wait for the brokers
// before it fails (kgo.RecordDeliveryTimeout) unless ClientOptions say
// otherwise.
const DefaultDeliveryTimeout = 30 * time.Second

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Brokers are the host:port addresses of the cluster's bootstrap
	// brokers. Required.
	Brokers []string

	// ClientOptions are franz-go client options (TLS, SASL, timeouts,
	// compression, ...), applied after the defaults, so they override
	// them. The defaults: client id "millrace", an idempotent producer
	// with acks from all in-sync replicas, no compression, sarama's hash
	// partitioner (FNV-1a, as watermill-kafka's own Publisher places keys),
	// topic auto-creation allowed, a 10 s dial timeout and a 30 s
	// (DefaultDeliveryTimeout) record delivery timeout.
	//
	// NewPublisher refuses options that break the per-key order promise:
	// kgo.DisableIdempotentWrite (retries and up to five requests in flight
	// per broker could reorder a partition), kgo.TransactionalID (records
	// would need a transaction), kgo.ManualFlushing (the Publisher flushes
	// itself). A partitioner must send equal keys to one partition, as
	// every key-hashing partitioner does.
	ClientOptions []kgo.Opt

	// MaxMessageBytes caps a record batch and so a record. The Publisher
	// asks the cluster for each topic's max.message.bytes (DescribeConfigs)
	// and uses the lower of the two; a record that does not fit is refused
	// before sending with ErrMessageTooLarge. Defaults to
	// DefaultMaxMessageBytes.
	MaxMessageBytes int32

	// Marshaler turns a Watermill message into a Kafka record; the
	// record's key, value, headers and timestamp are sent, and its key is
	// the one whose order the Publisher keeps. Defaults to
	// DefaultMarshaler(): watermill-kafka's format, keyed by the message
	// metadata core.MetadataPartitionKey, so watermill-kafka's Subscriber
	// reads it as usual.
	Marshaler Marshaler
}

// Publisher is a Watermill message.Publisher that sends all the messages of
// one Publish call to Kafka as one batch through a franz-go producer and
// waits for the brokers' acknowledgement of each. It is safe for concurrent
// use; Publish calls go out one after another.
//
// When some messages of a batch fail, Publish returns a *core.BatchError
// naming each failed message by its UUID; the others were delivered. A
// message is never stored after an earlier message of its record key in
// the same call failed (the key the Marshaler gives it: with
// DefaultMarshaler, its core.MetadataPartitionKey). Errors that retrying
// will not fix are marked with core.Permanent, errors that retrying will
// fix report Temporary() == true (the lists are in the package
// documentation).
type Publisher struct {
	brokers   []string
	opts      []kgo.Opt
	maxBytes  int32
	marshaler Marshaler
	logger    watermill.LoggerAdapter

	closed atomic.Bool
	sendMu sync.Mutex // one Publish at a time: the client buffers one call's records, then flushes
	client *kgo.Client
	// stale says why the client is to be renewed after this call, or is
	// empty (under sendMu): a topic's limit shrank, or the cluster no
	// longer knows the topic id the client holds.
	stale string

	// chunk is the most records one flush buffers (the client's
	// MaxBufferedRecords); chunkBytes the most bytes (0: no limit).
	chunk      int
	chunkBytes int64

	// clientMu guards client against Close while a call renews it.
	clientMu sync.Mutex

	limitsMu sync.Mutex
	topics   map[string]*topicState // limits.go
}

// NewPublisher connects to the brokers and returns a Publisher. It fails,
// naming the brokers it tried, when none of them answers within 10 seconds
// (or the dial timeout in ClientOptions). A nil logger logs errors to
// slog.Default() (the default of every millrace part, outbox.DefaultLogger).
func NewPublisher(cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: kafka: PublisherConfig.Brokers is required", core.ErrConfig)
	}
	for _, b := range cfg.Brokers {
		if strings.TrimSpace(b) == "" {
			return nil, fmt.Errorf("%w: kafka: empty broker address in PublisherConfig.Brokers %q", core.ErrConfig, cfg.Brokers)
		}
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.MaxMessageBytes < 512 || cfg.MaxMessageBytes > 1<<30 {
		return nil, fmt.Errorf("%w: kafka: PublisherConfig.MaxMessageBytes must be in 512..%d, got %d", core.ErrConfig, 1<<30, cfg.MaxMessageBytes)
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = DefaultMarshaler()
	}
	if logger == nil {
		logger = logging.Default()
	}
	p := &Publisher{
		brokers:   append([]string(nil), cfg.Brokers...),
		maxBytes:  cfg.MaxMessageBytes,
		marshaler: cfg.Marshaler,
		logger:    logger,
		topics:    map[string]*topicState{},
	}
	p.opts = append([]kgo.Opt{
		kgo.SeedBrokers(p.brokers...),
		kgo.ClientID("millrace"),
		kgo.DialTimeout(10 * time.Second),
		kgo.MetadataMinAge(time.Second), // notice a returning broker within a second
		kgo.AllowAutoTopicCreation(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))),
		kgo.RecordDeliveryTimeout(DefaultDeliveryTimeout),
		// Without it a record whose request went out (or whose dial
		// failed) waits for an answer forever while the broker is down.
		// With it, such a record fails after the delivery timeout and may
		// still have been stored: a duplicate when it is sent again, which
		// at-least-once delivery allows. Never a reorder: the broker
		// stores a producer's batches of a partition only in sequence,
		// and fences the old epoch once the client bumps it.
		kgo.AllowIdempotentProduceCancellation(),
	}, cfg.ClientOptions...)

	client, err := p.newClient()
	if err != nil {
		return nil, err
	}
	dial, _ := client.OptValue(kgo.DialTimeout).(time.Duration)
	ctx, cancel := context.WithTimeout(context.Background(), max(dial, time.Second))
	defer cancel()
	if err := client.Ping(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(p.brokers, ","), err)
	}
	p.client = client
	p.chunk = 50_000
	if n, ok := client.OptValue(kgo.MaxBufferedRecords).(int64); ok && n > 0 {
		p.chunk = int(n)
	}
	if n, ok := client.OptValue(kgo.MaxBufferedBytes).(int64); ok && n > 0 {
		p.chunkBytes = n
	}
	return p, nil
}

// newClient makes a client from the options, with the settings the
// Publisher relies on last, so they cannot be overridden.
func (p *Publisher) newClient() (*kgo.Client, error) {
	opts := append(append([]kgo.Opt(nil), p.opts...),
		kgo.ManualFlushing(),
		kgo.ProducerBatchMaxBytesFn(p.batchLimit),
		kgo.WithHooks(partitionedHook{}),
	)
	// The options are checked before the client is made, since ManualFlushing
	// and ProducerBatchMaxBytesFn above would hide the user's.
	probe, err := kgo.NewClient(p.opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: client options: %w", core.ErrConfig, err)
	}
	defer probe.Close()
	if err := checkOrderSafe(probe); err != nil {
		return nil, err
	}
	client, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: client options: %w", core.ErrConfig, err)
	}
	return client, nil
}

// checkOrderSafe refuses client settings under which a later record of a key
// could be stored before an earlier one.
func checkOrderSafe(c *kgo.Client) error {
	if off, _ := c.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		return fmt.Errorf("%w: kafka: kgo.DisableIdempotentWrite breaks per-key order (a retried request can land behind a later one); the Publisher needs the idempotent producer", core.ErrConfig)
	}
	if vs := c.OptValues(kgo.TransactionalID); len(vs) == 2 {
		if set, _ := vs[1].(bool); set {
			return fmt.Errorf("%w: kafka: kgo.TransactionalID is not supported: the Publisher does not produce in transactions", core.ErrConfig)
		}
	}
	if manual, _ := c.OptValue(kgo.ManualFlushing).(bool); manual {
		return fmt.Errorf("%w: kafka: kgo.ManualFlushing is not supported: the Publisher flushes each Publish call itself", core.ErrConfig)
	}
	return nil
}

// KeyPartition returns the partition, of a topic with n partitions, that
// the Publisher's default partitioner sends a record of key to (FNV-1a, as
// watermill-kafka's publisher and sarama's hash partitioner place keys).
// n must be positive.
func KeyPartition(key string, n int32) int32 {
	p := int32(fnv32a([]byte(key))) % n
	if p < 0 {
		p = -p
	}
	return p
}

func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	h.Write(b)
	return h.Sum32()
}

// Publish sends msgs to topic as one batch and returns when every message is
// acknowledged or has failed. Records of one key keep the order of msgs,
// and none is stored after an earlier one of its key failed. It
// returns nil when all were delivered, else a *core.BatchError listing
// every failed message by UUID (the others were delivered), each error
// marked permanent when retrying will not fix it. After Close, every message
// fails with ErrClosed.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return p.publishTopics([]topicBatch{{topic: topic, msgs: msgs}})
}

// PublishTopics is Publish for several topics at once: the messages of
// every topic of byTopic go out in one round to the brokers, where a
// Publish call per topic waits for the acknowledgements of one before the
// next is sent (a Publisher sends one call at a time). Each topic's
// messages are as in Publish: a key's records keep their order and none
// is stored after an earlier one of its key failed (a key is one per
// topic: the same key in two topics is two keys). The error is a
// *core.BatchError listing every failed message of every topic, each with
// its topic (a message sent to two topics is two copies, each failing or
// going out on its own), or nil. outbox.Relay uses it for a batch that holds several topics.
func (p *Publisher) PublishTopics(byTopic map[string][]*message.Message) error {
	topics := make([]string, 0, len(byTopic))
	for t := range byTopic {
		topics = append(topics, t)
	}
	slices.Sort(topics)
	batches := make([]topicBatch, len(topics))
	for i, t := range topics {
		batches[i] = topicBatch{topic: t, msgs: byTopic[t]}
	}
	return p.publishTopics(batches)
}

// topicBatch is one topic's messages of a call.
type topicBatch struct {
	topic string
	msgs  []*message.Message
	out   []outcome // its part of the call's outcomes
	first int       // the index of its first message in the call
	// limit is the topic's record batch limit; refusal, when set, fails
	// every message of the topic (a name Kafka refuses, a missing topic).
	limit   int32
	refusal error
}

func (p *Publisher) publishTopics(batches []topicBatch) error {
	n := 0
	for _, b := range batches {
		n += len(b.msgs)
	}
	if n == 0 {
		return nil
	}
	if p.closed.Load() {
		return failAll(batches, ErrClosed)
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if p.closed.Load() {
		return failAll(batches, ErrClosed)
	}
	err := p.publish(batches, n)
	if p.stale != "" {
		p.renewClient()
	}
	return err
}

// outcome is what became of one message of a Publish call.
type outcome struct {
	rec  *kgo.Record // nil when the Marshaler refused it without a key; only the key when with one
	err  error       // nil: delivered
	size int32       // the record's batch size when alone
}

// publish sends the batches' messages, n in all, in the same rounds.
func (p *Publisher) publish(batches []topicBatch, n int) error {
	c := &call{p: p, out: make([]outcome, n), failedKeys: map[string]bool{}, failedTopics: map[string]bool{}}
	i := 0
	for b := range batches {
		batches[b].first = i
		batches[b].out = c.out[i : i+len(batches[b].msgs)]
		i += len(batches[b].msgs)
	}
	for _, b := range batches {
		c.marshal(b)
	}
	for i := range batches {
		c.prepare(&batches[i])
	}
	if p.stale != "" {
		// Before sending: the client's batches must fit the topics.
		p.renewClient()
	}
	for _, b := range batches {
		c.buffer(b)
	}
	c.flush()
	for _, b := range batches {
		p.isolate(b.topic, b.msgs, b.out)
	}
	return p.report(batches)
}

// call is a Publish call in progress: what became of each of its messages,
// the keys held back after a failure, and the round being buffered.
type call struct {
	p   *Publisher
	out []outcome
	// A key with a failed message holds its later messages of this call
	// back, so they cannot overtake it (core.BatchError's contract).
	// Keys are per topic: topicKey. A message the Marshaler refused
	// without saying its key holds back its whole topic.
	failedKeys, failedTopics map[string]bool
	round                    []int // indexes into out
	roundBytes               int64
}

// marshal turns b's messages into records (in b.out), failing those the
// Marshaler refuses, permanently (buffer holds back what is behind them).
func (c *call) marshal(b topicBatch) {
	for i, msg := range b.msgs {
		o := &b.out[i]
		rec, err := c.p.marshaler.Marshal(b.topic, msg)
		if err == nil && rec == nil {
			err = errors.New("the Marshaler returned no record")
		}
		if pk, ok := msg.Metadata[core.MetadataPartitionKey]; err == nil && ok && string(rec.Key) != pk {
			err = fmt.Errorf("the Marshaler keyed the record by %q, not by its partition key %q: a message with a partition key is keyed by it, which the outbox orders by", rec.Key, pk)
		}
		if err == nil {
			rec.Topic = b.topic
			o.rec, o.size = rec, recordBatchSize(rec)
			continue
		}
		o.err = core.Permanent(fmt.Errorf("%w %s: %w", ErrMarshal, msg.UUID, err))
		if rec != nil {
			o.rec = &kgo.Record{Topic: b.topic, Key: rec.Key} // it says the key: hold that
		}
	}
}

// prepare finds whether b's topic takes records, and its limit: a topic
// name Kafka refuses fails its messages for good, a missing topic fails
// them at once (errMissingTopic). A record over the limit in use has the
// limit read again, once: it may have been raised.
func (c *call) prepare(b *topicBatch) {
	if err := ValidateTopic(b.topic); err != nil {
		b.refusal = core.Permanent(err)
		return
	}
	b.limit, b.refusal = c.p.limitFor(b.topic)
	if b.refusal != nil || b.limit >= c.p.maxBytes {
		return
	}
	for _, o := range b.out {
		if o.err == nil && o.size > b.limit {
			b.limit = c.p.rereadLimit(b.topic)
			return
		}
	}
}

// buffer puts b's records into rounds, in order, refusing those too large
// for their topic and holding back those behind a failure of their key: a
// record the Marshaler refused holds back its key, or its whole topic when
// the Marshaler did not say the key.
func (c *call) buffer(b topicBatch) {
	for i, msg := range b.msgs {
		o := &b.out[i]
		switch {
		case b.refusal != nil:
			if o.err == nil {
				o.err = b.refusal
			}
			continue
		case o.err != nil && o.rec == nil:
			c.failedTopics[b.topic] = true
			continue
		case o.err != nil:
			c.failedKeys[topicKey(b.topic, string(o.rec.Key))] = true
			continue
		}
		key := topicKey(b.topic, string(o.rec.Key))
		switch {
		case c.held(b.topic, key):
			o.err = temporary(fmt.Errorf("%w: message %s", ErrHeldBack, msg.UUID))
		case o.size > b.limit:
			o.err = core.Permanent(fmt.Errorf("%w: message %s needs %d bytes, topic %s takes %d",
				ErrMessageTooLarge, msg.UUID, o.size, b.topic, b.limit))
			c.failedKeys[key] = true
		default:
			if len(c.round) >= c.p.chunk || c.p.chunkBytes > 0 && c.roundBytes+int64(o.size) > c.p.chunkBytes {
				c.flush()
				if c.held(b.topic, key) {
					o.err = temporary(fmt.Errorf("%w: message %s", ErrHeldBack, msg.UUID))
					continue
				}
			}
			c.round = append(c.round, b.first+i)
			c.roundBytes += int64(o.size)
		}
	}
}

// held reports whether a message of key (a topicKey of topic) waits
// behind a failure.
func (c *call) held(topic, key string) bool { return c.failedKeys[key] || c.failedTopics[topic] }

// flush sends the round buffered and records which keys failed in it.
func (c *call) flush() {
	if len(c.round) == 0 {
		return
	}
	c.p.produce(c.out, c.round)
	for _, i := range c.round {
		if c.out[i].err != nil {
			c.failedKeys[topicKey(c.out[i].rec.Topic, string(c.out[i].rec.Key))] = true
		}
	}
	c.round, c.roundBytes = c.round[:0], 0
}

// report returns the call's BatchError (nil when everything went out),
// logging a partly failed topic and a key stored out of order.
func (p *Publisher) report(batches []topicBatch) error {
	var failed []core.MessageError
	for _, b := range batches {
		for i, o := range b.out {
			if o.err != nil {
				failed = append(failed, core.MessageError{UUID: b.msgs[i].UUID, Topic: b.topic, Err: o.err})
			}
		}
	}
	if len(failed) == 0 {
		return nil
	}
	for _, b := range batches {
		n := 0
		for _, o := range b.out {
			if o.err != nil {
				n++
			}
		}
		if n == 0 {
			continue
		}
		p.checkOrder(b.topic, b.msgs, b.out)
		p.logger.Debug("Kafka batch partly failed", watermill.LogFields{
			"topic": b.topic, "messages": len(b.msgs), "failed": n,
		})
	}
	return &core.BatchError{Errors: failed}
}

// topicKey is a record key of a topic: keys of different topics are
// different keys.
func topicKey(topic, key string) string { return topic + "\x00" + key }

// produce buffers the records of out at idx and flushes them, then sets
// their outcomes. Nothing is sent before all of them are buffered (manual
// flushing), and franz-go's idempotent producer fails every buffered record
// of a partition behind a failed batch of it: so a record is never stored
// after an earlier one of its partition, in this round, failed.
//
// Buffered means placed in its partition, which Produce does not always do
// before it returns: records for a topic whose partitions the client has
// not learnt yet (the first call to a topic) wait aside and are partitioned
// when the metadata arrives. Flushing then would let the first batches go
// while later records are still being partitioned; a refused batch fails
// only the records placed so far, and the later ones start fresh batches
// under a new producer epoch, which the broker stores. So produce waits
// until every record but the last is placed (partitionedHook) or has
// failed, then produces the last and flushes.
//
// One gap is closed by hand: the client's drain loop of the previous flush
// may still be running and send the first records of this round before the
// rest are placed. If one of those fails at once, a record of its partition
// placed after that failure would start a fresh batch. So the first failure
// reported while buffering stops the buffering (the rest are held back) and
// cancels the round's context, which makes the client fail, instead of
// send, every batch of the round not yet written.
func (p *Publisher) produce(out []outcome, idx []int) {
	if len(idx) == 0 { // isolate's round can be empty: every suspect held back
		return
	}
	var wg sync.WaitGroup
	wg.Add(len(idx))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The last record waits for the others to be placed: its Produce then
	// sees the topic's partitions (the client publishes them just after
	// placing the records set aside, and a Produce to a topic still
	// loading waits for that), and so does the Flush after it, which
	// otherwise would find no partition to drain and wait forever.
	last := len(idx) - 1
	rs := &roundState{
		pos:         make(map[*kgo.Record]int, len(idx)),
		partitioned: make([]atomic.Bool, len(idx)),
		done:        make([]atomic.Bool, last),
		placed:      make(chan struct{}),
	}
	rs.left.Store(int64(last))
	if last == 0 {
		close(rs.placed)
	}
	for k, i := range idx {
		rs.pos[out[i].rec] = k
	}
	ctx = context.WithValue(ctx, roundKey{}, rs)
	var buffering, early atomic.Bool
	buffering.Store(true)
	for k, i := range idx {
		if k == last {
			// Every record is placed or failed within the delivery
			// timeout: a topic whose partitions do not load fails its
			// waiting records then.
			<-rs.placed
		}
		if early.Load() {
			out[i].err = temporary(fmt.Errorf("%w: a record failed while the call was being buffered", ErrHeldBack))
			rs.mark(k)
			wg.Done()
			continue
		}
		out[i].rec.Context = ctx
		p.client.Produce(ctx, out[i].rec, func(_ *kgo.Record, err error) {
			out[i].err = err
			// Only the failure of a record placed in a partition can
			// leave a later record of that partition to start a fresh
			// batch. One that failed before (its topic's metadata did
			// not load: a missing or refused topic) says nothing of the
			// others, and must not fail them.
			if err != nil && buffering.Load() && rs.partitioned[k].Load() {
				early.Store(true)
				cancel()
			}
			rs.mark(k)
			wg.Done()
		})
	}
	buffering.Store(false)
	// Flush returns once nothing is buffered: every record was
	// acknowledged or failed (after the delivery timeout at the latest).
	_ = p.client.Flush(context.Background())
	wg.Wait()
	// A refusal for size makes the record's topic's limit be read again:
	// once for the round, not once per refused record (a refused batch
	// can hold thousands).
	limits := map[string]int32{}
	for _, i := range idx {
		if err := out[i].err; err != nil && !errors.Is(err, ErrHeldBack) {
			topic := out[i].rec.Topic
			refreshed := func() int32 {
				if _, ok := limits[topic]; !ok {
					limits[topic] = p.refreshLimit(topic)
				}
				return limits[topic]
			}
			out[i].err = p.classify(topic, out[i].size, err, refreshed)
		}
	}
}

// roundState tracks which records of a produce round are placed in their
// partitions (partitioned), and whether every record but the last is
// placed or failed (placed closes then).
type roundState struct {
	pos         map[*kgo.Record]int // record → its position in the round; read-only while producing
	partitioned []atomic.Bool
	done        []atomic.Bool
	left        atomic.Int64
	placed      chan struct{}
}

func (rs *roundState) mark(k int) {
	if k < len(rs.done) && rs.done[k].CompareAndSwap(false, true) && rs.left.Add(-1) == 0 {
		close(rs.placed)
	}
}

// roundKey is the context key of a produce round's *roundState; the round's
// records carry that context.
type roundKey struct{}

// partitionedHook tells a produce round that the client placed one of its
// records in its partition.
type partitionedHook struct{}

func (partitionedHook) OnProduceRecordPartitioned(r *kgo.Record, _ int32) {
	if r.Context == nil {
		return
	}
	if rs, ok := r.Context.Value(roundKey{}).(*roundState); ok {
		if k, ok := rs.pos[r]; ok {
			rs.partitioned[k].Store(true)
			rs.mark(k)
		}
	}
}

// isolate finds the message at fault when a batch failed with a permanent
// error: the broker refuses a record batch as a whole, and the client fails
// the partition's later batches with the same error. The messages that
// failed so are sent again one per partition at a time, in order, each
// alone in its batch, holding a key back after its first failure; a
// message that fails alone is the one at fault.
func (p *Publisher) isolate(topic string, msgs []*message.Message, out []outcome) {
	var suspects []int
	for i, o := range out {
		if o.rec != nil && errors.Is(o.err, errSuspect) {
			suspects = append(suspects, i)
		}
	}
	if len(suspects) == 0 {
		return
	}
	p.logger.Info("Kafka batch refused by the broker; sending its messages one at a time to find the one at fault",
		watermill.LogFields{"topic": topic, "messages": len(suspects)})
	// A record of the refused batch may have failed for good already (too
	// large for the limit learnt from the refusal): a suspect of its key
	// behind it must not be stored ahead of it.
	failedAt := map[string]int{}
	for i, o := range out {
		if o.rec == nil || o.err == nil || errors.Is(o.err, errSuspect) || errors.Is(o.err, ErrHeldBack) {
			continue
		}
		if _, ok := failedAt[string(o.rec.Key)]; !ok {
			failedAt[string(o.rec.Key)] = i
		}
	}
	failedKeys := map[string]bool{}
	for len(suspects) > 0 {
		var round, rest []int
		busy := map[int32]bool{}
		for _, i := range suspects {
			key := string(out[i].rec.Key)
			if at, ok := failedAt[key]; failedKeys[key] || ok && at < i {
				out[i].err = temporary(fmt.Errorf("%w: message %s", ErrHeldBack, msgs[i].UUID))
				continue
			}
			if part := out[i].rec.Partition; busy[part] {
				rest = append(rest, i)
				continue
			}
			busy[out[i].rec.Partition] = true
			round = append(round, i)
		}
		for _, i := range round {
			// A fresh record: franz-go keeps state in the one it was given.
			r := out[i].rec
			out[i].rec = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers, Timestamp: r.Timestamp}
			out[i].rec.Partition = r.Partition
		}
		p.produce(out, round)
		for _, i := range round {
			if err := out[i].err; err != nil {
				if errors.Is(err, errSuspect) { // alone, so it is the one at fault
					out[i].err = core.Permanent(errors.Unwrap(err))
				}
				failedKeys[string(out[i].rec.Key)] = true
			}
		}
		// Records of a partition that did not fail keep their order: rest
		// holds them in call order, minus this round's.
		suspects = rest
	}
}

// checkOrder logs, as an error, a key with a message stored after an earlier
// one of it failed. The design above rules it out; this makes a breach loud.
func (p *Publisher) checkOrder(topic string, msgs []*message.Message, out []outcome) {
	failed := map[string]bool{}
	failedAll := false // a message whose key the Marshaler did not say failed
	for i, o := range out {
		switch {
		case o.rec == nil:
			failedAll = true
		case o.err != nil:
			failed[string(o.rec.Key)] = true
		case failedAll || failed[string(o.rec.Key)]:
			p.logger.Error("Kafka message stored ahead of a failed message of its key", nil,
				watermill.LogFields{"topic": topic, "message_uuid": msgs[i].UUID, "record_key": string(o.rec.Key)})
		}
	}
}

// renewClient replaces the client with a new one, whose partitions take
// their batch limits and topic ids afresh. Called under sendMu. A
// Publisher closed meanwhile keeps its closed client, and the new one is
// closed at once.
func (p *Publisher) renewClient() {
	why := p.stale
	p.stale = ""
	c, err := p.newClient()
	if err != nil {
		p.logger.Error("Kafka client not renewed", err, nil)
		return
	}
	p.clientMu.Lock()
	if p.closed.Load() {
		p.clientMu.Unlock()
		c.Close()
		return
	}
	old := p.client
	p.client = c
	p.clientMu.Unlock()
	old.Close()
	p.clientRenewed()
	p.logger.Info("Kafka client renewed: "+why, nil)
}

// Close waits up to 10 seconds for the Publish call in progress, then
// closes the client, failing what is still unacknowledged (those messages
// are named in that call's BatchError; they may have been stored). Publish
// after Close fails with ErrClosed. Closing twice is a no-op.
func (p *Publisher) Close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	idle := make(chan struct{})
	go func() {
		p.sendMu.Lock()
		close(idle)
	}()
	closeClient := func() {
		p.clientMu.Lock()
		defer p.clientMu.Unlock()
		p.client.Close()
	}
	t := time.NewTimer(closeGrace)
	defer t.Stop()
	select {
	case <-idle:
		closeClient()
	case <-t.C:
		closeClient() // fails what the call in progress waits for
		<-idle
	}
	p.sendMu.Unlock()
	return nil
}

// closeGrace is how long Close lets the Publish call in progress finish.
var closeGrace = 10 * time.Second

func failAll(batches []topicBatch, err error) error {
	var failed []core.MessageError
	for _, b := range batches {
		for _, m := range b.msgs {
			failed = append(failed, core.MessageError{UUID: m.UUID, Topic: b.topic, Err: temporary(err)})
		}
	}
	return &core.BatchError{Errors: failed}
}

// recordBatchSize bounds from above the size of a record batch holding r
// alone, as a broker measures it against max.message.bytes: the v2 batch
// header (61 bytes) and the record with varints at their widest. franz-go
// refuses a record alone only above its exact size, which is no larger, so
// a record this check passes is never refused by the client on its own.
func recordBatchSize(r *kgo.Record) int32 {
	const batchHeader = 61
	const recordOverhead = 5 + 1 + 10 + 5 + 5 + 5 + 5 // length, attributes, timestamp and offset deltas, key and value lengths, header count
	n := batchHeader + recordOverhead + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 5 + len(h.Key) + 5 + len(h.Value)
	}
	return int32(min(n, 1<<31-1))
}
