package saga_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// A failure reason with a NUL byte (from a participant's reply or a local
// step's error) reaches the step state's jsonb as U+FFFD, as it does
// last_error: the reply is applied, not redelivered forever.
func TestNULInFailureReasonIsStored(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-nul-reason"
	start(t, d.testBundle, def, id, 1)
	d.deliver(replyMsg(id, d.last(id), core.OutcomeFailure, "no\x00money", ""))
	in := d.get(id)
	if in.Status != saga.StatusCompensated || !strings.Contains(in.LastError, "no\uFFFDmoney") {
		t.Fatalf("%s %q", in.Status, in.LastError)
	}
	if r := in.Steps["credit"].Reason; !strings.Contains(r, "no\uFFFDmoney") {
		t.Fatalf("step reason %q", r)
	}
	// Through a batch (HandleReplies), likewise.
	id = "o-nul-batch"
	start(t, d.testBundle, def, id, 1)
	if _, err := d.o.HandleReplies(context.Background(), []*message.Message{
		replyMsg(id, d.last(id), core.OutcomeFailure, "no\x00money", ""),
	}); err != nil {
		t.Fatal(err)
	}
	if in := d.get(id); in.Status != saga.StatusCompensated || !strings.Contains(in.Steps["credit"].Reason, "no\uFFFDmoney") {
		t.Fatalf("batch: %s %+v", in.Status, in.Steps["credit"])
	}

	// A compensation's failure reason, likewise.
	id = "o-nul-comp"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	d.deliver(replyMsg(id, d.last(id), core.OutcomeFailure, "no stock", ""))
	c := d.last(id)
	if c.Op != "compensation" {
		t.Fatalf("no compensation: %+v", c)
	}
	d.deliver(replyMsg(id, c, core.OutcomeFailure, "later\x00", ""))
	if in := d.get(id); !strings.Contains(in.Steps[c.Step].Reason, "later\uFFFD") {
		t.Fatalf("compensation reason %q", in.Steps[c.Step].Reason)
	}
}

// A local step's error with a NUL byte, likewise.
func TestNULInLocalStepErrorIsStored(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[1].Local = func(ctx context.Context, tx pgx.Tx, o *order) error { return saga.Fail("bad\x00input") }
	})
	id := "o-nul-local"
	start(t, d.testBundle, def, id, 1)
	d.reply(id, d.last(id), core.OutcomeSuccess)
	in := d.get(id)
	if in.Status != saga.StatusCompensating || !strings.Contains(in.Steps["approve"].Reason, "bad\uFFFDinput") {
		t.Fatalf("%s %+v", in.Status, in.Steps["approve"])
	}
}

// A success reply whose OnSuccess puts a NUL into the data (the outbox
// keeps such a payload as written; jsonb refuses it) parks the saga as
// stuck with the reason, as a reply that cannot be decoded does; a local
// step that does so fails; start data with one is refused.
func TestDataWithNULIsRefused(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "o-nul-data"
	start(t, d.testBundle, def, id, 1)
	d.deliver(replyMsg(id, d.last(id), core.OutcomeSuccess, "", `{"tx":"a\u0000b"}`))
	in := d.get(id)
	if in.Status != saga.StatusStuck || !strings.Contains(in.LastError, "step credit: applying its reply") ||
		!strings.Contains(in.LastError, `\u0000`) || in.Steps["credit"].Status != saga.StepDone {
		t.Fatalf("%s %q %+v", in.Status, in.LastError, in.Steps["credit"])
	}

	d2, def2 := orderDriver(t, func(s *saga.Spec[order]) {
		s.Steps[1].Local = func(ctx context.Context, tx pgx.Tx, o *order) error { o.CreditTx = "x\x00"; return nil }
	})
	id = "o-nul-local-data"
	start(t, d2.testBundle, def2, id, 1)
	d2.reply(id, d2.last(id), core.OutcomeSuccess)
	if in := d2.get(id); in.Status != saga.StatusCompensating || !strings.Contains(in.LastError, `\u0000`) {
		t.Fatalf("%s %q", in.Status, in.LastError)
	}

	_, err := saga.Start(context.Background(), d.o, def, "o-nul-start", order{ID: "a\x00"})
	if !errors.Is(err, saga.ErrUnstorableData) {
		t.Fatalf("start with NUL data: %v", err)
	}
}
