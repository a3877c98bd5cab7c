package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/millrace/millrace/core"
)

// How the relays read a publisher's failures. A failure is one of:
//
//   - permanent (isPermanent): sending the event again cannot succeed. It
//     is dead-lettered at once, with its reason.
//   - temporary (isTemporary): the publisher, the broker or a partition is
//     away; sending again later will work. No attempt is charged.
//   - anything else: the event (or its topic) is at fault for now. An
//     attempt is charged, the event is retried with backoff, and
//     dead-lettered after MaxAttempts.
//
// A batch in which every event failed, each failure temporary, is an
// outage: it is rolled back and the worker backs off (uncharged).

// isPermanent reports whether err says that sending the event again cannot
// succeed: marked with core.Permanent, or a refusal a transport makes of a
// message for good (refusedForGood).
func isPermanent(err error) bool { return core.IsPermanent(err) || refusedForGood(err) }

// transportRefusals are what transports without typed errors say of a
// message they will never take, as the Watermill publishers report it.
var transportRefusals = []string{
	"nats: maximum payload exceeded",          // NATS: over the server's max_payload
	"ERR Protocol error: invalid bulk length", // Redis: over proto-max-bulk-len
}

// refusedForGood reports whether err is a transport's refusal of a
// message for good (transportRefusals).
func refusedForGood(err error) bool {
	msg := err.Error()
	for _, s := range transportRefusals {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// isTemporary reports whether err says that sending again later will work:
// an error with a Temporary() bool method that returns true (kafka.Publisher
// marks outages, timeouts and leader elections so; the convention of
// net.Error), any net.Error (connection refused or reset, timeouts), or a
// context deadline; not a failure the relay found the event at fault for
// (failedAlone). Such a failure charges no attempt.
func isTemporary(err error) bool {
	var alone failedAloneError
	if errors.As(err, &alone) {
		return false
	}
	var t interface{ Temporary() bool }
	if errors.As(err, &t) && t.Temporary() {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)
}

// uncharged reports whether a failure charges no attempt when every
// event of its batch failed: temporary, not tried, or untold.
func uncharged(err error) bool {
	var u untoldError
	return errors.Is(err, errNotTried) || errors.As(err, &u) || isTemporary(err)
}

// unavailableError marks a failure that says nothing against the event:
// the publisher failed a whole call and nothing told its messages apart.
// It is temporary: it charges no attempt.
type unavailableError struct{ err error }

func (e unavailableError) Error() string   { return e.err.Error() }
func (e unavailableError) Unwrap() error   { return e.err }
func (e unavailableError) Temporary() bool { return true }

func unavailable(err error) error { return unavailableError{err} }

// untoldError marks the failure of a call of one message that a publisher
// failed whole: whether the message or the publisher is at fault, the
// call does not tell. The batch does: when other messages of it went out,
// the event is charged (it is not temporary); when nothing did, the batch
// is an outage (allUncharged).
type untoldError struct{ err error }

func (e untoldError) Error() string { return e.err.Error() }
func (e untoldError) Unwrap() error { return e.err }

func untold(err error) error {
	if isPermanent(err) || isTemporary(err) {
		return err
	}
	return untoldError{err}
}

// failedAloneError marks the failure of an event sent alone while other
// messages of the same pass went out: the event is at fault, whatever its
// error says (see findAtFault).
type failedAloneError struct{ err error }

func (e failedAloneError) Error() string {
	return fmt.Sprintf("%v (the event is at fault: it failed alone)", e.err)
}
func (e failedAloneError) Unwrap() error { return e.err }

func failedAlone(err error) error {
	if isPermanent(err) {
		return err
	}
	return failedAloneError{err}
}

// errNotTried marks the events of a call that a publisher did not get to:
// the one-at-a-time search stopped at an outage.
var errNotTried = errors.New("outbox: not tried: the publisher is unavailable")

// allUncharged reports whether every one of rows failed, each failure
// charging nothing: an outage.
func allUncharged(rows []pendingRow, failed map[int64]error) bool {
	if len(failed) < len(rows) {
		return false
	}
	for _, err := range failed {
		if !uncharged(err) {
			return false
		}
	}
	return true
}
