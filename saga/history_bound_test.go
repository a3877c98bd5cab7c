package saga_test

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// Duplicates of a reply to a finished step, one at a time and in a batch,
// leave one fenced row with their count, not a row each; a different
// fenced reply starts a row of its own.
func TestRepeatedFencedRepliesCollapseIntoACount(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	id := "dup-bound"
	stock := stockRunning(t, d, def, id)
	d.reply(id, stock, core.OutcomeSuccess)
	if in := d.get(id); in.Status != saga.StatusCompleted {
		t.Fatalf("saga %s, want completed", in.Status)
	}
	before := len(historyOf(t, d.o, id))

	const single, batched = 50, 30
	for range single {
		d.reply(id, stock, core.OutcomeSuccess)
	}
	msgs := make([]*message.Message, batched)
	for i := range msgs {
		msgs[i] = replyMsg(id, stock, core.OutcomeSuccess, "because", "")
	}
	res, err := d.o.HandleReplies(context.Background(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Fenced != batched {
		t.Fatalf("batch: %d fenced, want %d", res.Fenced, batched)
	}
	h := historyOf(t, d.o, id)
	if len(h) != before+1 {
		t.Fatalf("%d duplicate replies added %d history rows, want 1", single+batched, len(h)-before)
	}
	last := h[len(h)-1]
	if last.Event != "fenced" || fencedRepeats(t, last) != single+batched {
		t.Fatalf("last entry %s %s, want fenced with count %d", last.Event, last.Detail, single+batched)
	}

	// Another attempt's reply is another fenced event: a row of its own.
	other := stock
	other.Attempt++
	d.reply(id, other, core.OutcomeSuccess)
	d.reply(id, other, core.OutcomeSuccess)
	h = historyOf(t, d.o, id)
	if len(h) != before+2 || fencedRepeats(t, h[len(h)-1]) != 2 || h[len(h)-1].Attempt != other.Attempt {
		t.Fatalf("after another attempt's replies: %d rows (want %d), last %+v", len(h), before+2, h[len(h)-1])
	}
	if n := fencedCount(t, d.o, id); n != single+batched+2 {
		t.Fatalf("fenced count %d, want %d", n, single+batched+2)
	}
}
