package inbox

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/sqlident"
)

// ErrNoEventID is returned for a message that carries no usable event id:
// the id function failed or gave something that is not a UUID. It always
// comes wrapped as core.Permanent, naming the message's UUID, so that
// retrying is skipped (see ShouldRetry) and Watermill's PoisonQueue
// middleware dead-letters the message with the reason in its metadata.
var ErrNoEventID = errors.New("inbox: message has no usable event id")

// configSchema returns the configured schema name validated (the default when
// empty); an invalid name is a config error.
func configSchema(name string) (string, error) {
	s, err := sqlident.Schema(name)
	if err != nil {
		return "", fmt.Errorf("%w: %v", core.ErrConfig, err)
	}
	return s, nil
}

// DefaultEventID takes the id from metadata core.MetadataEventID
// ("event_id", set by the outbox relay), falling back to the Watermill
// message UUID when that metadata is absent.
func DefaultEventID(msg *message.Message) (string, error) {
	if id := msg.Metadata.Get(core.MetadataEventID); id != "" {
		return id, nil
	}
	return msg.UUID, nil
}

// eventID applies fn and checks the result is a UUID. The error wraps
// ErrNoEventID and is permanent.
func eventID(fn func(*message.Message) (string, error), msg *message.Message) (uuid.UUID, error) {
	s, err := fn(msg)
	if err != nil {
		return uuid.UUID{}, core.Permanent(fmt.Errorf("%w: message %q: %v", ErrNoEventID, msg.UUID, err))
	}
	if s == "" {
		return uuid.UUID{}, core.Permanent(fmt.Errorf("%w: message %q has neither %s metadata nor a UUID", ErrNoEventID, msg.UUID, core.MetadataEventID))
	}
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.UUID{}, core.Permanent(fmt.Errorf("%w: message %q: event id %q is not a UUID", ErrNoEventID, msg.UUID, s))
	}
	return id, nil
}

// ShouldRetry is a ready-made middleware.Retry ShouldRetry: it stops
// retrying permanent errors (core.IsPermanent), such as ErrNoEventID,
// so they reach the PoisonQueue middleware at once.
func ShouldRetry(p middleware.RetryParams) bool { return !core.IsPermanent(p.Err) }
