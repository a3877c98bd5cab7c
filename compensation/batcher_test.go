package compensation_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millrace/millrace/compensation"
	"github.com/millrace/millrace/core"
)

// Concurrent callers of a Batcher share transactions; each gets its own
// result: nil, its technical error, or a permanent error for a malformed
// command; the barrier's guarantees hold (one effect per action, even with
// duplicates and no dedup marks).
func TestBatcherGroupsCommandsAndKeepsResultsApart(t *testing.T) {
	t.Parallel()
	b := setup(t, 8)
	if _, err := b.p.NewBatcher(compensation.BatchConfig{MaxBatch: -1}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("negative MaxBatch: %v", err)
	}
	bt, err := b.p.NewBatcher(compensation.BatchConfig{MaxBatch: 50, Transactions: 2})
	if err != nil {
		t.Fatal(err)
	}
	// flaky's action fails technically three times: in its batch, and when
	// the failed batch is run again one command at a time. Its two commands
	// may sit in one batch or in two batches in flight at once; three
	// failures make at least one of them report the technical error either
	// way (with two, the two batches could use them up and both one-at-a-time
	// runs succeed).
	flaky := uuid.NewString()
	var flakyCalls atomic.Int32
	b.setFailAction(func(call compensation.Call) error {
		if call.SagaID == flaky && flakyCalls.Add(1) <= 3 {
			return errTechnical
		}
		return nil
	})
	const sagas, callers = 400, 16
	ids := make([]string, sagas)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	ids[17] = flaky
	type result struct {
		msg *message.Message
		err error
	}
	work := make(chan *message.Message)
	results := make(chan result, 4*sagas)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for m := range work {
				results <- result{m, bt.Handle(m)}
			}
		})
	}
	bad := action(uuid.NewString(), 1)
	bad.Metadata.Set(core.MetadataSagaAttempt, "x")
	start := time.Now()
	for i, id := range ids {
		work <- action(id, 1)
		work <- action(id, 2) // a retry, as a new message
		if i == sagas/2 {
			work <- bad
		}
	}
	close(work)
	wg.Wait()
	close(results)
	var technical, permanent int
	retry := []*message.Message{}
	for r := range results {
		switch {
		case r.err == nil:
		case errors.Is(r.err, errTechnical):
			technical++
			retry = append(retry, r.msg)
		case r.msg == bad && errors.Is(r.err, compensation.ErrInvalidCommand) && core.IsPermanent(r.err):
			permanent++
		default:
			t.Fatalf("message %s: %v", r.msg.UUID, r.err)
		}
	}
	// One or both of flaky's commands (two batches in flight at once may
	// each hold one) report the technical error.
	if technical < 1 || technical > 2 || permanent != 1 {
		t.Fatalf("technical errors %d, permanent %d; want 1 or 2, and 1", technical, permanent)
	}
	for _, m := range retry { // redelivered until it goes through (the failures are used up)
		err := bt.Handle(m)
		for n := 0; errors.Is(err, errTechnical) && n < 3; n++ {
			err = bt.Handle(m)
		}
		must(t, err)
	}
	t.Logf("%d commands in %v", 2*sagas+1, time.Since(start))
	for _, id := range ids {
		if n := b.effects(t, id, "reserve"); n != 1 {
			t.Fatalf("saga %s: %d effects, want 1", id, n)
		}
		if rs := b.replies(t, id); len(rs) != 2 || rs[0].Payload != rs[1].Payload {
			t.Fatalf("saga %s: replies %+v, want two identical", id, rs)
		}
	}
	// Rows written by one transaction share its xmin: fewer transactions
	// than rows means commands were grouped.
	txs := b.count(t, `SELECT count(DISTINCT xmin::text) FROM `+b.db.Schema+`.compensation_barrier`)
	if txs >= sagas {
		t.Fatalf("%d transactions wrote %d barrier rows: no batching", txs, sagas)
	}
	t.Logf("%d barrier rows written by %d transactions", sagas, txs)
}
