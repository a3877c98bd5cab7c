package compensation

import (
	"errors"
)

// ErrFailure is the sentinel of business failures: errors.Is(err,
// compensation.ErrFailure) reports whether err came from Fail.
var ErrFailure = errors.New("compensation: business failure")

// failure is a business failure returned by an action or a compensation:
// "insufficient credit". Fail makes one.
type failure struct {
	reason string
}

func (e *failure) Error() string { return "business failure: " + e.reason }

// Is makes errors.Is(err, ErrFailure) true.
func (e *failure) Is(target error) bool { return target == ErrFailure }

// Fail returns the business failure reason. An action that returns it (or
// an error wrapping it) replies core.OutcomeFailure with the reason, and
// nothing it wrote takes effect. Since it had no effect it is not final:
// the barrier records the failure with its attempt, answers that attempt
// and earlier ones (sent again, or late) with it, and runs the action again
// for a later attempt (a step the orchestrator retries), unless the
// compensation came in between (the action is then cancelled for good). A
// compensation that returns it also replies failure and has no effect, and
// is not final either: the orchestrator retries the compensation with
// backoff (and parks the saga stuck when its budget is spent), and a later
// attempt runs it again.
//
// Any other error is technical (the database is down, a bug): the whole
// transaction rolls back, nothing is replied, and the message is retried.
func Fail(reason string) error { return &failure{reason: reason} }

// asFailure returns the business failure in err's chain.
func asFailure(err error) (*failure, bool) {
	var f *failure
	ok := errors.As(err, &f)
	return f, ok
}
