package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

// Define refuses what it can check itself: a topic no outbox writes, and
// a Type whose default reply topic brokers refuse.
func TestDefineRefusesBadTopics(t *testing.T) {
	t.Parallel()
	step := func(topic string) saga.Step[order] {
		return saga.Step[order]{Name: "a", Kind: saga.Compensatable, Action: &saga.Command[order]{Topic: topic}}
	}
	long := strings.Repeat("t", outbox.MaxKeyBytes+1)
	for _, c := range []struct {
		name  string
		spec  saga.Spec[order]
		wants string
	}{
		{"space in Type", saga.Spec[order]{Type: "order saga", Version: 1, Steps: []saga.Step[order]{step("t")}}, "set ReplyTopic"},
		{"NUL in command topic", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{step("t\x00")}}, "Action.Topic"},
		{"long command topic", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{step(long)}}, "longer than"},
		{"bad compensation topic", saga.Spec[order]{Type: "x", Version: 1, Steps: []saga.Step[order]{func() saga.Step[order] {
			s := step("t")
			s.Compensation = &saga.Command[order]{Topic: "\xff"}
			return s
		}()}}, "Compensation.Topic"},
		{"bad reply topic", saga.Spec[order]{Type: "x", Version: 1, ReplyTopic: "r\x00", Steps: []saga.Step[order]{step("t")}}, "ReplyTopic"},
	} {
		_, err := saga.Define(c.spec)
		if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), c.wants) {
			t.Errorf("%s: %v, want an ErrConfig with %q", c.name, err, c.wants)
		}
	}
	// The same Type with a reply topic of its own is fine.
	if _, err := saga.Define(saga.Spec[order]{Type: "order saga", Version: 1, ReplyTopic: "order-saga.replies", Steps: []saga.Step[order]{step("t")}}); err != nil {
		t.Fatal(err)
	}
}

// Register refuses a definition whose topics the orchestrator's Writer
// refuses; a command the outbox refuses at run time (a definition started
// without being registered) parks the saga as stuck with the reason,
// instead of failing every try.
func TestOutboxRefusedCommandParksTheSaga(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOptions{})
	w, err := outbox.NewWriter(b.db.Pool, outbox.WriterConfig{Schema: b.db.Schema, ValidateTopic: kafka.ValidateTopic})
	if err != nil {
		t.Fatal(err)
	}
	o, err := saga.New(b.db.Pool, saga.Config{Schema: b.db.Schema, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	spec := orderSpec(b, 1)
	spec.Steps[0].Action.Topic = "credit topic"
	def := mustDefine(t, spec)
	var ee *outbox.EventError
	if err := o.Register(def); !errors.Is(err, core.ErrConfig) || !errors.As(err, &ee) || !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("register: %v", err)
	}
	in, err := saga.Start(context.Background(), o, def, "o-bad-topic", order{ID: "o-bad-topic", Amount: 1})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "step credit: the outbox refuses the action command") ||
		!strings.Contains(in.LastError, `"credit topic"`) {
		t.Fatalf("%s %q", in.Status, in.LastError)
	}
	got, err := o.Get(context.Background(), "o-bad-topic")
	if err != nil || got.Status != saga.StatusStuck || got.NextWakeupAt != nil {
		t.Fatalf("stored: %v %+v", err, got)
	}
}
