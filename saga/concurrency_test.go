package saga_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/saga"
)

// A reply, a timer and an operator action on one saga at the same moment:
// the row lock serializes them, whatever the order no update is lost (the
// revision counts every change), the attempts on the wire only grow, and
// the saga stays consistent with its history. Whatever came first (the
// timer backs off, the operator sends attempt 2), the reply to attempt 1
// is the step's answer: every saga completes.
func TestReplyTimerAndOperatorAtOnce(t *testing.T) {
	t.Parallel()
	d, def := orderDriver(t, nil)
	ctx := context.Background()
	const n = 20
	for i := range n {
		id := fmt.Sprintf("race-%d", i)
		start(t, d.testBundle, def, id, 1)
		d.reply(id, d.last(id), core.OutcomeSuccess) // now waiting at stock, attempt 1
	}
	d.clock.Advance(time.Second) // every stock attempt is due to time out
	var wg sync.WaitGroup
	errs := make(chan error, 3*n)
	for i := range n {
		id := fmt.Sprintf("race-%d", i)
		stock := d.last(id)
		wg.Add(3)
		go func() { defer wg.Done(); errs <- d.handler(replyMsg(id, stock, core.OutcomeSuccess, "", "")) }()
		go func() { defer wg.Done(); _, err := d.o.RunDue(ctx); errs <- err }()
		go func() {
			defer wg.Done()
			_, err := d.o.Retry(ctx, id, operator)
			if errors.Is(err, saga.ErrActionNotAllowed) {
				err = nil // the reply came first: the saga ended
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	outcomes := map[saga.Status]int{}
	defer func() { t.Logf("outcomes %v", outcomes) }()
	for i := range n {
		id := fmt.Sprintf("race-%d", i)
		in := d.get(id)
		outcomes[in.Status]++
		changes := 0
		lastAttempt := map[string]int{}
		for _, h := range historyOf(t, d.o, id) {
			switch h.Event {
			case "started", "reply", "timeout", "operator":
				changes++ // each of these is one committed change of the row
			case "command":
				if h.Attempt <= lastAttempt[h.Step+h.Operation] {
					t.Fatalf("%s: attempt %d of %s after %d", id, h.Attempt, h.Step, lastAttempt[h.Step+h.Operation])
				}
				lastAttempt[h.Step+h.Operation] = h.Attempt
			}
		}
		if in.Revision != int64(changes) {
			t.Errorf("%s: revision %d, but %d changes in the history (a lost or unrecorded update)", id, in.Revision, changes)
		}
		st := in.Steps["stock"]
		switch in.Status {
		case saga.StatusCompleted:
			if st.Status != saga.StepDone {
				t.Errorf("%s completed with stock %+v", id, st)
			}
		default:
			t.Errorf("%s: %s", id, in.Status)
		}
	}
}
