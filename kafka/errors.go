package kafka

import (
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"

	"github.com/millrace/millrace"
)

// permanentKErrors are the broker's answers about a record or its topic that
// the same record sent again will get again. Not here: faults of the
// producer's configuration or of the cluster that fail every record alike
// (cluster authorization, required acks, compression type), unknown topics
// (auto-creation may be off until someone creates the topic), leadership
// changes, timeouts and network errors. They pass, or an operator fixes
// them, and the records then go through; marking them permanent would
// dead-letter everything.
var permanentKErrors = map[sarama.KError]bool{
	sarama.ErrInvalidMessage:              true, // CORRUPT_MESSAGE
	sarama.ErrInvalidMessageSize:          true, // INVALID_FETCH_SIZE
	sarama.ErrMessageSizeTooLarge:         true, // MESSAGE_TOO_LARGE
	sarama.ErrInvalidTopic:                true, // INVALID_TOPIC_EXCEPTION
	sarama.ErrMessageSetSizeTooLarge:      true, // RECORD_LIST_TOO_LARGE
	sarama.ErrTopicAuthorizationFailed:    true, // TOPIC_AUTHORIZATION_FAILED
	sarama.ErrInvalidTimestamp:            true, // INVALID_TIMESTAMP
	sarama.ErrUnsupportedForMessageFormat: true, // UNSUPPORTED_FOR_MESSAGE_FORMAT
	sarama.ErrPolicyViolation:             true, // POLICY_VIOLATION
	sarama.ErrInvalidRecord:               true, // INVALID_RECORD
}

// classify marks err permanent when sending the same record again cannot
// succeed, and makes every too-large error match ErrMessageTooLarge.
func classify(err error) error {
	var kerr sarama.KError
	if errors.As(err, &kerr) && permanentKErrors[kerr] {
		if kerr == sarama.ErrMessageSizeTooLarge || kerr == sarama.ErrMessageSetSizeTooLarge {
			return millrace.Permanent(fmt.Errorf("%w: %w", ErrMessageTooLarge, err))
		}
		return millrace.Permanent(err)
	}
	// The producer refuses a record larger than Producer.MaxMessageBytes
	// before sending it, with a ConfigurationError naming that setting.
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) && strings.Contains(string(cerr), "MaxMessageBytes") {
		return millrace.Permanent(fmt.Errorf("%w: %w", ErrMessageTooLarge, err))
	}
	return err
}
