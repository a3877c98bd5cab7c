package kafka

import (
	"errors"
	"fmt"
)

// maxTopicLength is the longest topic name Kafka accepts.
const maxTopicLength = 249

// ErrInvalidTopic is wrapped by ValidateTopic's errors.
var ErrInvalidTopic = errors.New("kafka: invalid topic name")

// ValidateTopic returns an error wrapping ErrInvalidTopic for a topic name
// Kafka refuses: empty, "." or "..", longer than maxTopicLength, or with a
// character outside [a-zA-Z0-9._-] (the broker's own check,
// org.apache.kafka.common.internals.Topic.validate). Give it to the outbox
// writer (outbox.WriterConfig.ValidateTopic) so that such a topic is refused
// when the event is written, not when the relay publishes it.
func ValidateTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	case topic == "." || topic == "..":
		return fmt.Errorf("%w: %q is reserved", ErrInvalidTopic, topic)
	case len(topic) > maxTopicLength:
		return fmt.Errorf("%w: %d characters, at most %d", ErrInvalidTopic, len(topic), maxTopicLength)
	}
	for i := 0; i < len(topic); i++ {
		if c := topic[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q holds %q at byte %d; use only a-z, A-Z, 0-9, '.', '_' and '-'", ErrInvalidTopic, topic, c, i)
		}
	}
	return nil
}
