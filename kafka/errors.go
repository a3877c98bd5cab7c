package kafka

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millrace/millrace/core"
)

// batchKErrors are the broker's answers about a record batch or its topic
// that the same records sent again will get again. The broker refuses a
// batch as a whole, so the record at fault is found by sending the batch's
// records alone (Publisher.isolate). Not here: faults of the producer's
// configuration or of the cluster that fail every record alike (cluster
// authorization, required acks), unknown topics (auto-creation may be off
// until someone creates the topic), leadership changes, timeouts and
// network errors. They pass, or an operator fixes them, and the records then
// go through; marking them permanent would dead-letter everything.
var batchKErrors = map[*kerr.Error]bool{
	kerr.CorruptMessage:              true,
	kerr.InvalidFetchSize:            true,
	kerr.MessageTooLarge:             true,
	kerr.RecordListTooLarge:          true,
	kerr.InvalidTimestamp:            true,
	kerr.UnsupportedForMessageFormat: true,
	kerr.PolicyViolation:             true,
	kerr.InvalidRecord:               true,
}

// The broker's answers about a topic rather than a record. A name it
// refuses is refused for good: permanent. A topic that does not exist, or
// that the producer may not write to, is a fault an operator fixes (creates
// the topic, grants the ACL): neither permanent, which would dead-letter
// every event of the topic at the first refusal, nor temporary, which
// would retry them uncharged for ever; the outbox relay charges an attempt
// for it, backs off, and dead-letters the event after its MaxAttempts
// (about a quarter of an hour with its defaults).

// errSuspect marks a record that failed with its batch for a reason that
// may be another record's: Publisher.isolate sends it again alone.
var errSuspect = errors.New("kafka: refused with its record batch")

type suspectError struct{ err error }

func (e suspectError) Error() string        { return e.err.Error() }
func (e suspectError) Unwrap() error        { return e.err }
func (e suspectError) Is(target error) bool { return target == errSuspect }

// temporaryError is an error that sending the same message again, later,
// will fix: the broker is away, busy, or electing a leader.
type temporaryError struct{ err error }

func (e temporaryError) Error() string   { return e.err.Error() }
func (e temporaryError) Unwrap() error   { return e.err }
func (e temporaryError) Temporary() bool { return true }

func temporary(err error) error { return temporaryError{err} }

// classify turns the error of one record into what the Publisher reports:
// permanent when sending the same record again cannot succeed (and, for
// size, matching ErrMessageTooLarge), temporary when it can, a suspect when
// the broker refused the record's batch for a reason that may be another
// record's, as it was otherwise.
//
// refreshed is the topic's limit as learnt again after a refusal for size;
// it is called only for such a refusal, and at most once per round.
//
// Anything not known to be the record's or its topic's fault is temporary:
// an outage, a leader election, a timeout, or a fault of the producer's or
// the cluster's configuration that fails every record alike (cluster
// authorization, required acks), which an operator fixes and after which
// the records go through.
func (p *Publisher) classify(topic string, size int32, err error, refreshed func() int32) error {
	switch {
	case errors.Is(err, kgo.ErrClientClosed):
		return temporary(fmt.Errorf("%w: %w", ErrClosed, err))
	case errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge):
		// Our limit was above the topic's (it changed, or could not be
		// read): learn it again. A record that fits alone was refused
		// with a batch too large for the topic.
		limit := refreshed()
		if size > limit {
			return core.Permanent(fmt.Errorf("%w: %d bytes, topic %s takes %d: %w", ErrMessageTooLarge, size, topic, limit, err))
		}
		return suspectError{fmt.Errorf("%w: %w", ErrMessageTooLarge, err)}
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		if ke == kerr.UnknownTopicID {
			// The topic was deleted and made again (or the broker lost
			// it) under a new id, and franz-go keeps producing with the
			// old one: a new client learns the new id.
			p.stale = "the cluster no longer knows the id of topic " + topic
			return temporary(err)
		}
		switch {
		case ke == kerr.InvalidTopicException:
			return core.Permanent(err)
		case ke == kerr.UnknownTopicOrPartition:
			// The client waited for its metadata (UnknownTopicRetries):
			// the topic is gone. Its next records fail at once until the
			// cluster is asked again.
			p.markMissing(topic)
			return errMissingTopic(topic, err)
		case ke == kerr.TopicAuthorizationFailed:
			return fmt.Errorf("kafka: not authorized to write to topic %s: %w", topic, err)
		case batchKErrors[ke]:
			return suspectError{err}
		}
		return temporary(err)
	}
	return temporary(err)
}
