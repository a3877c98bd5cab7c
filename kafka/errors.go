package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"

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

// topicKErrors are the broker's answers about a topic: every record of it
// gets the same, so each is permanent as it stands.
var topicKErrors = map[*kerr.Error]bool{
	kerr.InvalidTopicException:    true,
	kerr.TopicAuthorizationFailed: true,
}

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

// IsTemporary reports whether err, or an error it wraps, says it is
// temporary (has a Temporary() bool method returning true), as the
// Publisher's errors for outages, timeouts, leader elections and held-back
// messages do. The outbox relay charges no attempt for such a failure.
func IsTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// classify turns the error of one record into what the Publisher reports:
// permanent when sending the same record again cannot succeed (and, for
// size, matching ErrMessageTooLarge), temporary when it can, a suspect when
// the broker refused the record's batch for a reason that may be another
// record's, as it was otherwise.
//
// refreshed is the topic's limit as learnt again after a refusal for size;
// it is called only for such a refusal, and at most once per round.
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
		if topicKErrors[ke] {
			return core.Permanent(err)
		}
		if batchKErrors[ke] {
			return suspectError{err}
		}
		if ke.Retriable {
			return temporary(err)
		}
		return err
	}
	var ne net.Error
	switch {
	case errors.Is(err, kgo.ErrRecordTimeout), errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, kgo.ErrMaxBuffered), errors.Is(err, kgo.ErrAborting),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled),
		errors.As(err, &ne), kgo.IsRetryableBrokerErr(err):
		return temporary(err)
	}
	return err
}
