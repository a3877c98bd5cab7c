package saga_test

import (
	"context"
	"slices"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// handleBatch applies msgs with HandleReplies, the batch path the
// service runs (RunBatched), in one transaction.
func (d *driver) handleBatch(msgs ...*message.Message) *saga.BatchResult {
	d.t.Helper()
	res, err := d.o.HandleReplies(context.Background(), msgs)
	if err != nil {
		d.t.Fatal(err)
	}
	if len(res.Poisoned) > 0 {
		d.t.Fatalf("poisoned %v", res.Poisoned)
	}
	return res
}

// A saga that ends through the batch path (HandleReplies, RunBatched's)
// files the events still pending for its wait steps as ignored, as every
// other path that ends a saga does: none stays pending for ever.
func TestBatchEndedSagaClosesPendingEvents(t *testing.T) {
	t.Parallel()
	d, def := setupAwait(t, single, bundleOptions{})
	for _, id := range []string{"b-10a", "b-10b"} {
		startPayment(t, d, def, id)
		// Early: stored pending, for the wait step ahead.
		d.signal(id, "payment.confirmed", "psp-"+id, confirmation{Ref: id})
		if got := d.eventStates(id); !slices.Equal(got, []string{"payment.confirmed/pending"}) {
			t.Fatalf("%s: events %v", id, got)
		}
	}
	// Both sagas' first steps fail, in one batch: each compensates (nothing
	// took effect) and ends.
	d.handleBatch(replyMsg("b-10a", d.last("b-10a"), core.OutcomeFailure, "out of stock", ""),
		replyMsg("b-10b", d.last("b-10b"), core.OutcomeFailure, "out of stock", ""))
	for _, id := range []string{"b-10a", "b-10b"} {
		if in := d.get(id); in.Status != saga.StatusCompensated {
			t.Fatalf("%s: status %s (%s)", id, in.Status, in.LastError)
		}
		if got := d.eventStates(id); !slices.Equal(got, []string{"payment.confirmed/ignored"}) {
			t.Fatalf("%s ended through HandleReplies: events %v, want the pending one ignored", id, got)
		}
	}
}
