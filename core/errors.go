package core

import (
	"errors"
	"fmt"
	"strings"
)

// errPermanent marks a failure that retrying will not fix, such as a
// message the broker rejects as too large: Permanent wraps an error with
// it and IsPermanent tests for it.
var errPermanent = errors.New("permanent failure")

type permanentError struct{ err error }

func (e permanentError) Error() string        { return e.err.Error() }
func (e permanentError) Unwrap() []error      { return []error{e.err, errPermanent} }
func (e permanentError) Is(target error) bool { return target == errPermanent }

// Permanent wraps err so that IsPermanent reports true for it. It returns nil
// for a nil err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err: err}
}

// IsPermanent reports whether err, or any error it wraps, is marked permanent.
func IsPermanent(err error) bool { return errors.Is(err, errPermanent) }

// MessageError is the failure of one message in a batch, named by the
// message's Watermill UUID and, in a call that sends to several topics,
// its topic: one message may go to several topics (a fan-out keeps the
// UUID), and each copy fails or goes out on its own.
type MessageError struct {
	UUID string
	// Topic is the topic of the failed copy; empty in a call of one topic
	// (Publish), where the UUID alone names it.
	Topic string
	Err   error
}

// BatchError is returned by publishers that can tell which messages of a
// Publish call failed; the others were published. The outbox relay uses it
// to retry or dead-letter only the failed messages.
//
// A publisher that returns it keeps per-key order: once a message fails, it
// does not publish a later message of the same partition key from the same
// call, but reports it failed too (millrace's Kafka publisher does so).
type BatchError struct {
	Errors []MessageError
}

func (e *BatchError) Error() string {
	if len(e.Errors) == 1 {
		return fmt.Sprintf("publish failed for message %s: %v", e.Errors[0].UUID, e.Errors[0].Err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "publish failed for %d messages", len(e.Errors))
	for i, me := range e.Errors {
		if i == 3 {
			b.WriteString("; ...")
			break
		}
		fmt.Fprintf(&b, "; %s: %v", me.UUID, me.Err)
	}
	return b.String()
}

// Unwrap returns the individual message errors, so errors.Is and errors.As
// look through them.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.Errors))
	for i, me := range e.Errors {
		errs[i] = me.Err
	}
	return errs
}

// ErrInvalidEventID is wrapped by the errors of calls that take event ids
// (the dead-letter APIs' Requeue and Discard) for an id that is not a UUID.
// Such a call checks every id before it sends anything, so a caller's
// transaction passed to its ...Tx form is left as it was.
var ErrInvalidEventID = errors.New("millrace: event id is not a UUID")
