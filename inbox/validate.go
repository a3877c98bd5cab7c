package inbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
)

// ErrUnstorable is returned by the Receiver for a message the inbox cannot
// store unchanged: its partition key, its subscribe topic, or a metadata
// key or value contains NUL or is not valid UTF-8. These are stored in
// text and jsonb columns, which refuse NUL and would turn invalid UTF-8
// into U+FFFD; the payload is stored byte for byte whatever it holds. The
// error names the message and the field, and always comes wrapped as
// core.Permanent: retrying cannot help, so ShouldRetry stops and a
// PoisonQueue takes the message. Nothing of the call is stored.
var ErrUnstorable = errors.New("inbox: message cannot be stored unchanged")

// textProblem says why s cannot be stored unchanged in a text or jsonb
// value, or returns "" when it can.
func textProblem(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "contains NUL"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	return ""
}

// checkStorable returns a permanent error wrapping ErrUnstorable when the
// text fields of msg cannot be stored unchanged.
func checkStorable(msg *message.Message, topic, key string) error {
	fail := func(what, s string, problem string) error {
		return core.Permanent(fmt.Errorf("%w: message %q: %s %q %s", ErrUnstorable, msg.UUID, what, s, problem))
	}
	if p := textProblem(key); p != "" {
		return fail("partition key", key, p)
	}
	if p := textProblem(topic); p != "" {
		return fail("topic", topic, p)
	}
	for k, v := range msg.Metadata {
		if p := textProblem(k); p != "" {
			return fail("metadata key", k, p)
		}
		if p := textProblem(v); p != "" {
			return fail("metadata "+fmt.Sprintf("%q", k)+" value", v, p)
		}
	}
	return nil
}

// checkConsumer refuses a consumer name that the inbox's text columns
// cannot hold, as a config error.
func checkConsumer(field, name string) error {
	if name == "" {
		return fmt.Errorf("%w: %s is required", core.ErrConfig, field)
	}
	if p := textProblem(name); p != "" {
		return fmt.Errorf("%w: %s %q %s", core.ErrConfig, field, name, p)
	}
	return nil
}
