package compensation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
)

// Call describes the command a participant function is running for. It is
// read from the command message's metadata (the saga wire protocol of
// package millrace).
type Call struct {
	// SagaID is the saga instance's id.
	SagaID string
	// SagaType is the saga type's name.
	SagaType string
	// Step is the step's name.
	Step string
	// Attempt is the command's attempt number, from 1. Every attempt is a
	// new message; the barrier runs the function for one of them only.
	Attempt int
	// Operation is core.OperationAction or core.OperationCompensation.
	Operation string
	// Command is the command's name, which the participant routed on.
	Command string
	// ReplyTopic is where the reply goes.
	ReplyTopic string
	// IdempotencyKey is the same for every attempt of this saga's step and
	// operation, and differs between the action and its compensation: pass
	// it to external APIs (a payment provider) whose side effects no
	// database transaction can roll back. It is a UUID (see IdempotencyKey).
	IdempotencyKey string
	// ActionReply is, for a compensation, the reply payload (JSON) the
	// action gave when it ran: what it reserved, say. It is nil for an
	// action.
	ActionReply []byte
	// Message is the command message, for its other metadata (trace
	// context, say). Do not change it.
	Message *message.Message
}

// idempotencyNamespace is the UUIDv5 namespace of idempotency keys.
var idempotencyNamespace = uuid.MustParse("6d1b8f8e-5c3a-4a8e-9f0e-6a1f3b2c7d40")

// IdempotencyKey returns the stable idempotency key of a saga's step and
// operation: the UUIDv5 (SHA-1), in namespace
// 6d1b8f8e-5c3a-4a8e-9f0e-6a1f3b2c7d40, of sagaID, step and operation joined
// by NUL bytes. A participant in another language computes the same key.
func IdempotencyKey(sagaID, step, operation string) string {
	return uuid.NewSHA1(idempotencyNamespace, []byte(sagaID+"\x00"+step+"\x00"+operation)).String()
}

// ErrInvalidCommand is returned for a command message whose saga metadata
// is missing or malformed, whose payload does not decode into the
// command's type, or whose reply the outbox Writer refuses (its reply
// topic, say). It comes wrapped as core.Permanent, naming the message
// and the fault, so the inbox's ShouldRetry skips retrying it and a
// PoisonQueue dead-letters it with the reason.
var ErrInvalidCommand = errors.New("compensation: invalid command message")

// ErrUnknownCommand is returned, permanent, for a command whose name no
// Register call of the participant declared.
var ErrUnknownCommand = errors.New("compensation: unknown command")

// maxIdentifier is the longest saga id, step, type or command name a
// participant accepts, in bytes.
const maxIdentifier = 200

// parseCall reads the saga metadata of msg. Each value that is stored in
// the barrier (text columns) must be valid UTF-8 without NUL, or PostgreSQL
// would refuse it on every retry.
func parseCall(msg *message.Message) (Call, error) {
	md := msg.Metadata
	c := Call{
		SagaID:     md.Get(core.MetadataSagaID),
		SagaType:   md.Get(core.MetadataSagaType),
		Step:       md.Get(core.MetadataSagaStep),
		Operation:  md.Get(core.MetadataSagaOperation),
		Command:    md.Get(core.MetadataSagaCommand),
		ReplyTopic: md.Get(core.MetadataSagaReplyTopic),
		Message:    msg,
	}
	for _, f := range []struct {
		key, value string
		required   bool
	}{
		{core.MetadataSagaID, c.SagaID, true},
		{core.MetadataSagaType, c.SagaType, false},
		{core.MetadataSagaStep, c.Step, true},
		{core.MetadataSagaCommand, c.Command, true},
		{core.MetadataSagaReplyTopic, c.ReplyTopic, true},
	} {
		if err := checkIdentifier(f.value, f.required); err != nil {
			return c, invalid(msg, "metadata %s %q: %v", f.key, f.value, err)
		}
	}
	if c.Operation != core.OperationAction && c.Operation != core.OperationCompensation {
		return c, invalid(msg, "metadata %s is %q, want %q or %q", core.MetadataSagaOperation,
			c.Operation, core.OperationAction, core.OperationCompensation)
	}
	a := md.Get(core.MetadataSagaAttempt)
	n, err := strconv.Atoi(a)
	if err != nil || n < 1 {
		return c, invalid(msg, "metadata %s is %q, want a positive decimal number", core.MetadataSagaAttempt, a)
	}
	c.Attempt = n
	c.IdempotencyKey = IdempotencyKey(c.SagaID, c.Step, c.Operation)
	// The headers above address the reply in every protocol version; the
	// rest of a command of a version this participant does not speak is
	// not read (protocol.go).
	return c, checkProtocol(md)
}

func checkIdentifier(s string, required bool) error {
	switch {
	case s == "" && required:
		return errors.New("missing")
	case len(s) > maxIdentifier:
		return fmt.Errorf("longer than %d bytes", maxIdentifier)
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains NUL")
	}
	return nil
}

func invalid(msg *message.Message, format string, args ...any) error {
	return core.Permanent(fmt.Errorf("%w: message %q: %s", ErrInvalidCommand, msg.UUID, fmt.Sprintf(format, args...)))
}

// cleanReason makes a business failure's reason storable: valid UTF-8,
// no NUL, at most 1000 bytes.
func cleanReason(s string) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
	if len(s) > 1000 {
		s = strings.ToValidUTF8(s[:1000], "")
	}
	return s
}
