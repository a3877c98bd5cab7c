package kafka

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/eapache/go-resiliency/breaker"

	"github.com/millrace/millrace"
)

// Errors returned by NewPublisher and Publish. Test for them with errors.Is.
var (
	// ErrInvalidConfig is returned by NewPublisher for a configuration it
	// cannot work with.
	ErrInvalidConfig = errors.New("kafka: invalid publisher config")
	// ErrClosed is the error of every message published after Close.
	ErrClosed = errors.New("kafka: publisher closed")
	// ErrMarshal is the error of a message the Marshaler refused (for
	// example one whose metadata uses watermill-kafka's reserved UUID key).
	// Such a message was not sent; the error is permanent.
	ErrMarshal = errors.New("kafka: cannot marshal message")
	// ErrMessageTooLarge is the error of a message larger than the
	// producer's Producer.MaxMessageBytes or than the broker accepts. It
	// is permanent.
	ErrMessageTooLarge = errors.New("kafka: message too large")
	// ErrHeldBack is the error of a message not sent because an earlier
	// message of the same partition key in the same Publish call was
	// refused; sending it would have put it ahead of that message. It is
	// temporary: it goes out once the refused message is dealt with.
	ErrHeldBack = errors.New("kafka: held back behind a refused message of the same key")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Brokers are the host:port addresses of the cluster's bootstrap
	// brokers. Required.
	Brokers []string

	// Sarama is the producer configuration. Producer.Return.Successes and
	// Producer.Return.Errors must be true (a sarama SyncProducer needs both)
	// and Version at least 0.11 (records carry headers). NewPublisher does
	// not modify it. Defaults to DefaultSaramaConfig().
	Sarama *sarama.Config

	// Marshaler turns a Watermill message into a Kafka record. Whatever it
	// puts in ProducerMessage.Metadata is overwritten. Defaults to
	// watermill-kafka's partitioning marshaler keyed by the message metadata
	// millrace.MetadataPartitionKey: the record carries the message UUID in
	// the "_watermill_message_uuid" header, the metadata as headers, the
	// payload as value and the partition key as key (an empty key when the
	// metadata is missing), so watermill-kafka's Subscriber reads it as
	// usual.
	Marshaler wkafka.Marshaler
}

// DefaultMarshaler returns the marshaler a Publisher uses when
// PublisherConfig.Marshaler is nil: watermill-kafka's partitioning marshaler
// with the record key taken from millrace.MetadataPartitionKey. It also
// unmarshals, for a watermill-kafka Subscriber.
func DefaultMarshaler() wkafka.MarshalerUnmarshaler {
	return wkafka.NewWithPartitioningMarshaler(partitionKeyFromMetadata)
}

func partitionKeyFromMetadata(_ string, msg *message.Message) (string, error) {
	return msg.Metadata.Get(millrace.MetadataPartitionKey), nil
}

// Publisher is a Watermill message.Publisher that sends all the messages of
// one Publish call to Kafka as one batch through a sarama SyncProducer and
// waits for the brokers' acknowledgement of each. It is safe for concurrent
// use: Publish may be called from several goroutines, and Close waits for the
// Publish calls in progress.
//
// When some messages of a batch fail, Publish returns a *millrace.BatchError
// naming each failed message by its UUID; the others were delivered. Errors
// that retrying will not fix are marked with millrace.Permanent (the list is
// in the package documentation).
type Publisher struct {
	brokers   []string
	sarama    *sarama.Config
	marshaler wkafka.Marshaler
	logger    watermill.LoggerAdapter
	lastRenew atomic.Int64 // unix nanoseconds of the last renewProducer attempt

	mu       sync.RWMutex // held for reading by Publish, for writing by Close
	closed   bool
	producer sarama.SyncProducer

	batches sync.Pool // of *[]*sarama.ProducerMessage
}

// NewPublisher connects to the brokers and returns a Publisher. It fails,
// naming the brokers it tried, when none of them answers within the sarama
// configuration's dial timeout and metadata retries. A nil logger logs
// nothing.
func NewPublisher(cfg PublisherConfig, logger watermill.LoggerAdapter) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	}
	for _, b := range cfg.Brokers {
		if strings.TrimSpace(b) == "" {
			return nil, fmt.Errorf("%w: empty broker address in %q", ErrInvalidConfig, cfg.Brokers)
		}
	}
	sc := cfg.Sarama
	if sc == nil {
		sc = DefaultSaramaConfig()
	}
	if !sc.Producer.Return.Successes {
		return nil, fmt.Errorf("%w: Sarama.Producer.Return.Successes must be true (a sync producer waits for each acknowledgement)", ErrInvalidConfig)
	}
	if !sc.Producer.Return.Errors {
		return nil, fmt.Errorf("%w: Sarama.Producer.Return.Errors must be true (a sync producer reports each failure)", ErrInvalidConfig)
	}
	if !sc.Version.IsAtLeast(sarama.V0_11_0_0) {
		return nil, fmt.Errorf("%w: Sarama.Version %s is older than 0.11, which cannot carry record headers", ErrInvalidConfig, sc.Version)
	}
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	marshaler := cfg.Marshaler
	if marshaler == nil {
		marshaler = DefaultMarshaler()
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}

	producer, err := sarama.NewSyncProducer(cfg.Brokers, sc)
	if err != nil {
		return nil, fmt.Errorf("kafka: connect to brokers %s: %w", strings.Join(cfg.Brokers, ","), err)
	}
	return &Publisher{
		brokers:   append([]string(nil), cfg.Brokers...),
		sarama:    sc,
		marshaler: marshaler,
		logger:    logger,
		producer:  producer,
	}, nil
}

// Publish sends msgs to topic as one batch and returns when every message is
// acknowledged or has failed. Records of one partition key keep the order of
// msgs. It returns nil when all were delivered, else a *millrace.BatchError
// listing every failed message by UUID (the others were delivered), each
// error marked permanent when retrying will not fix it. After Close, every
// message fails with ErrClosed.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	breakerOpen, err := p.publish(topic, msgs)
	if breakerOpen {
		p.renewProducer()
	}
	return err
}

// renewInterval is the least time between two attempts to replace a producer
// whose circuit breaker is open.
const renewInterval = time.Second

// renewProducer replaces the producer with a new one when the brokers answer
// again. Sarama's producer keeps a circuit breaker per topic that opens after
// three failures to look up the topic's partitions (brokers down) and then
// refuses every record for 10 seconds, even once the brokers are back; a
// new producer has closed breakers. It tries at most once per
// renewInterval and keeps the old producer while the brokers stay away.
func (p *Publisher) renewProducer() {
	now := time.Now().UnixNano()
	last := p.lastRenew.Load()
	if now-last < int64(renewInterval) || !p.lastRenew.CompareAndSwap(last, now) {
		return
	}
	np, err := sarama.NewSyncProducer(p.brokers, p.sarama)
	if err != nil {
		p.logger.Debug("Kafka producer not renewed: brokers still unreachable", watermill.LogFields{"err": err})
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		np.Close()
		return
	}
	old := p.producer
	p.producer = np
	p.mu.Unlock()
	// No Publish uses old any more: they all held the read lock.
	if err := old.Close(); err != nil {
		p.logger.Debug("Closing the replaced Kafka producer", watermill.LogFields{"err": err})
	}
	p.logger.Info("Kafka producer renewed after its circuit breaker opened", nil)
}

// publish is Publish under the read lock. breakerOpen reports that some
// record failed on the producer's open circuit breaker.
func (p *Publisher) publish(topic string, msgs []*message.Message) (breakerOpen bool, err error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return false, failAll(msgs, ErrClosed)
	}

	bp := p.getBatch(len(msgs))
	defer p.putBatch(bp)
	batch := *bp
	var failed []millrace.MessageError
	// A key whose message is refused here keeps its later messages of this
	// call back, so they cannot overtake it (millrace.BatchError's contract).
	var refusedKeys map[string]bool
	refuse := func(msg *message.Message, key []byte, err error) {
		failed = append(failed, millrace.MessageError{UUID: msg.UUID, Err: err})
		if refusedKeys == nil {
			refusedKeys = map[string]bool{}
		}
		refusedKeys[string(key)] = true
	}
	for _, msg := range msgs {
		pm, err := p.marshaler.Marshal(topic, msg)
		if err != nil {
			refuse(msg, []byte(msg.Metadata.Get(millrace.MetadataPartitionKey)),
				millrace.Permanent(fmt.Errorf("%w %s: %w", ErrMarshal, msg.UUID, err)))
			continue
		}
		key, _ := keyBytes(pm)
		if refusedKeys[string(key)] {
			refuse(msg, key, fmt.Errorf("%w: message %s", ErrHeldBack, msg.UUID))
			continue
		}
		// The size check sarama would make after accepting the batch, made
		// here so the key's later messages can be held back.
		if size := pm.ByteSize(2); size > p.sarama.Producer.MaxMessageBytes {
			refuse(msg, key, millrace.Permanent(fmt.Errorf("%w: message %s is %d bytes, Producer.MaxMessageBytes is %d",
				ErrMessageTooLarge, msg.UUID, size, p.sarama.Producer.MaxMessageBytes)))
			continue
		}
		// The failure of a record comes back with the record: Metadata
		// names the message it came from (a pointer: no allocation).
		pm.Metadata = msg
		batch = append(batch, pm)
	}
	*bp = batch

	if len(batch) > 0 {
		if err := p.producer.SendMessages(batch); err != nil {
			failed = appendSendErrors(failed, batch, err)
		}
	}
	if len(failed) == 0 {
		return false, nil
	}
	p.logger.Debug("Kafka batch partly failed", watermill.LogFields{
		"topic": topic, "messages": len(msgs), "failed": len(failed),
	})
	for _, me := range failed {
		if errors.Is(me.Err, breaker.ErrBreakerOpen) {
			breakerOpen = true
			break
		}
	}
	return breakerOpen, &millrace.BatchError{Errors: failed}
}

// appendSendErrors turns the error of SendMessages into one MessageError per
// failed record.
func appendSendErrors(failed []millrace.MessageError, batch []*sarama.ProducerMessage, err error) []millrace.MessageError {
	var perrs sarama.ProducerErrors
	if !errors.As(err, &perrs) {
		// Not per-record: every record counts as failed, retryable.
		for _, pm := range batch {
			failed = append(failed, millrace.MessageError{UUID: pm.Metadata.(*message.Message).UUID, Err: err})
		}
		return failed
	}
	for _, pe := range perrs {
		uuid := ""
		if m, ok := pe.Msg.Metadata.(*message.Message); ok {
			uuid = m.UUID
		}
		failed = append(failed, millrace.MessageError{UUID: uuid, Err: classify(pe.Err)})
	}
	return failed
}

// Close closes the producer, after waiting for the Publish calls in
// progress. Publish after Close fails with ErrClosed. Closing twice is a
// no-op.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	if err := p.producer.Close(); err != nil {
		return fmt.Errorf("kafka: close producer for %s: %w", strings.Join(p.brokers, ","), err)
	}
	return nil
}

func (p *Publisher) getBatch(n int) *[]*sarama.ProducerMessage {
	if v := p.batches.Get(); v != nil {
		bp := v.(*[]*sarama.ProducerMessage)
		if cap(*bp) >= n {
			return bp
		}
	}
	s := make([]*sarama.ProducerMessage, 0, n)
	return &s
}

func (p *Publisher) putBatch(bp *[]*sarama.ProducerMessage) {
	b := *bp
	clear(b) // drop the records so they can be collected
	*bp = b[:0]
	p.batches.Put(bp)
}

func failAll(msgs []*message.Message, err error) error {
	failed := make([]millrace.MessageError, len(msgs))
	for i, m := range msgs {
		failed[i] = millrace.MessageError{UUID: m.UUID, Err: err}
	}
	return &millrace.BatchError{Errors: failed}
}

// keyBytes returns the record key of pm, nil when it has none.
func keyBytes(pm *sarama.ProducerMessage) ([]byte, error) {
	if pm.Key == nil {
		return nil, nil
	}
	return pm.Key.Encode()
}
