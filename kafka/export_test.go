package kafka

import "errors"

// IsTemporary reports whether err, or an error it wraps, says it is
// temporary (has a Temporary() bool method returning true), as the
// outbox relay reads it.
func IsTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
