package compensation

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
)

// parseCall accepts a command only with storable metadata (valid UTF-8, no
// NUL, at most 200 bytes, the required keys present), a known operation and
// a positive attempt; anything else is a permanent ErrInvalidCommand that
// names the message. It never panics.
func FuzzParseCall(f *testing.F) {
	f.Add("saga-1", "order", "credit", "1", "action", "reserve_credit", "replies")
	f.Add("s", "", "step", "007", "compensation", "c", "r")
	f.Add("", "t", "step", "1", "action", "c", "r")
	f.Add("s\x00", "t", "step", "1", "action", "c", "r")
	f.Add("s", "t", "\xff", "1", "action", "c", "r")
	f.Add("s", "t", "step", "-1", "action", "c", "r")
	f.Add("s", "t", "step", "99999999999999999999", "action", "c", "r")
	f.Add("s", "t", "step", "1", "Action", "c", "r")
	f.Add(strings.Repeat("x", 201), "t", "step", "1", "action", "c", "r")
	f.Fuzz(func(t *testing.T, sagaID, sagaType, step, attempt, operation, command, replyTopic string) {
		msg := message.NewMessage("m-1", nil)
		for k, v := range map[string]string{
			core.MetadataSagaID: sagaID, core.MetadataSagaType: sagaType, core.MetadataSagaStep: step,
			core.MetadataSagaAttempt: attempt, core.MetadataSagaOperation: operation,
			core.MetadataSagaCommand: command, core.MetadataSagaReplyTopic: replyTopic,
		} {
			msg.Metadata.Set(k, v)
		}
		call, err := parseCall(msg)
		if err != nil {
			if !errors.Is(err, ErrInvalidCommand) || !core.IsPermanent(err) || !strings.Contains(err.Error(), `"m-1"`) {
				t.Fatalf("error %v: want a permanent ErrInvalidCommand naming the message", err)
			}
			return
		}
		for _, s := range []string{call.SagaID, call.SagaType, call.Step, call.Command, call.ReplyTopic} {
			if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || len(s) > maxIdentifier {
				t.Fatalf("accepted an unstorable value %q", s)
			}
		}
		if call.SagaID == "" || call.Step == "" || call.Command == "" || call.ReplyTopic == "" {
			t.Fatalf("accepted a command missing a required key: %+v", call)
		}
		if call.Attempt < 1 || (call.Operation != core.OperationAction && call.Operation != core.OperationCompensation) {
			t.Fatalf("accepted attempt %d, operation %q", call.Attempt, call.Operation)
		}
		if call.IdempotencyKey != IdempotencyKey(call.SagaID, call.Step, call.Operation) {
			t.Fatal("idempotency key differs from IdempotencyKey")
		}
	})
}

// The idempotency key is stable (across versions and languages), and differs between the action and the
// compensation, and between steps whose names would run together.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	a := IdempotencyKey("s", "step", core.OperationAction)
	if a != IdempotencyKey("s", "step", core.OperationAction) || a == IdempotencyKey("s", "step", core.OperationCompensation) ||
		IdempotencyKey("ab", "c", "action") == IdempotencyKey("a", "bc", "action") {
		t.Fatal("idempotency keys collide or vary")
	}
	// Pinned: a participant in another language computes the same, e.g.
	// Python's uuid.uuid5(UUID('6d1b8f8e-5c3a-4a8e-9f0e-6a1f3b2c7d40'), 'order-1\x00credit\x00action').
	if k := IdempotencyKey("order-1", "credit", core.OperationAction); k != "9b8bdfcb-79ed-5876-a2ea-b11a89b809b2" {
		t.Fatalf("IdempotencyKey changed: %s", k)
	}
}
