package saga_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// A retriable step whose action fails once with a business failure: the
// saga retries it, the participant's barrier lets the next attempt run the
// action (a failure had no effect), it succeeds, and the saga completes
// with the effect applied once.
func TestRetriableStepRunsAgainAfterBusinessFailure(t *testing.T) {
	t.Parallel()
	e := setupE2E(t, false)
	var failed sync.Map
	e.failStock = func(id string) bool { _, again := failed.LoadOrStore(id, true); return !again }
	def := mustDefine(t, saga.Spec[order]{
		Type: "order", Version: 1, ReplyTopic: e.replyTopic,
		Steps: []saga.Step[order]{
			{
				Name: "approve", Kind: saga.Pivot,
				Local: func(ctx context.Context, tx pgx.Tx, o *order) error {
					return e.effect(ctx, tx, o.ID, "approve", "do")
				},
			},
			{
				Name: "stock", Kind: saga.Retriable, Timeout: 10 * time.Second,
				Action: &saga.Command[order]{Topic: e.stockTopic},
				Retry:  saga.RetryPolicy{MaxAttempts: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond},
			},
		},
	})
	e.start(t, def)
	start(t, e.testBundle, def, "retry-after-failure", 1)
	in := e.waitStatus("retry-after-failure", saga.StatusCompleted, saga.StatusStuck)
	if in.Status != saga.StatusCompleted {
		t.Fatalf("saga %s: %s, want completed", in.Status, in.LastError)
	}
	if got := e.effects(in.ID); len(got) != 2 || got[1] != "stock:do" {
		t.Fatalf("effects %v, want approve once and stock once", got)
	}
	hist, err := e.o.History(context.Background(), in.ID)
	if err != nil {
		t.Fatal(err)
	}
	var replies []string
	for _, h := range hist {
		if h.Event == "reply" && h.Step == "stock" {
			replies = append(replies, h.Outcome)
		}
	}
	if len(replies) != 2 || replies[0] != core.OutcomeFailure || replies[1] != core.OutcomeSuccess {
		t.Fatalf("stock replies %v, want a failure then a success", replies)
	}
}
