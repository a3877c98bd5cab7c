package saga_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// drain runs the orchestrator's timer passes until the bulk operation has
// every outcome, or fails the test after a deadline.
func drain(t *testing.T, o *saga.Orchestrator, p *saga.Orchestrator, id string) *saga.BulkOperation {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := o.RunDue(ctx); err != nil {
			t.Fatal(err)
		}
		b, err := p.BulkStatus(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if b.Done() {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("bulk operation %s not done: %+v", id, b.Counts)
		}
	}
}

// A bulk retry by query: the dry run counts and lists what the query
// selects and changes nothing; the plan records the selection; a saga that
// changed after it was selected, and one with another request pending,
// are refused at filing and not acted on; one that changes after its
// request was filed is refused by the orchestrator; one whose request is
// withdrawn is counted so; the others are applied by the running
// orchestrator, each with the operator, the reason and the operation in
// its history.
func TestBulkRetryByQuery(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ctx := context.Background()
	ids := s.StuckRefunds(t, db, "refund", 30)
	s.WaitingShip(t, "ship-1") // running at step reserve: not selected
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	q := saga.Query{Status: saga.StatusStuck, Step: "reserve", Error: "%no such reservation%"}

	dry, err := p.DryRun(ctx, q, 5)
	if err != nil {
		t.Fatal(err)
	}
	if dry.Count != 30 || len(dry.First) != 5 || dry.First[0].ID != ids[29] {
		t.Fatalf("dry run: %d sagas, page of %d starting %v; want 30, 5, the newest %s", dry.Count, len(dry.First), dry.First[0].ID, ids[29])
	}
	if in := s.Get(t, ids[0]); in.Request != nil {
		t.Fatalf("the dry run recorded a request: %+v", in.Request)
	}
	if d, err := p.DryRun(ctx, saga.Query{Status: saga.StatusStuck, Error: "%refund hold%"}, 5); err != nil || d.Count != 0 {
		t.Fatalf("dry run on an error nobody has: %+v, %v", d, err)
	}
	if _, err := p.DryRun(ctx, saga.Query{}, 5); !errors.Is(err, saga.ErrInvalidQuery) {
		t.Fatalf("dry run on the empty query: %v, want ErrInvalidQuery", err)
	}

	by := saga.Actor{Operator: "alice", Reason: "stock service fixed"}
	plan, err := p.Plan(ctx, saga.ActionRetry, q, by)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Counts.Selected != 30 || plan.Counts.Unfiled != 30 || len(plan.Sample) != 20 || plan.Filed != nil {
		t.Fatalf("plan: %+v, sample of %d", plan.Counts, len(plan.Sample))
	}
	// After the dry run: ids[0] changes (an operator retried it by hand,
	// still failing), ids[1] gets another operator's request.
	if _, err := s.O.Retry(ctx, ids[0], saga.Actor{Operator: "bob", Reason: "trying one by hand"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Request(ctx, ids[1], saga.ActionRetry, saga.Actor{Operator: "bob", Reason: "mine"}); err != nil {
		t.Fatal(err)
	}
	changed := s.Get(t, ids[0])

	b, err := p.Apply(ctx, plan.ID, by)
	if err != nil {
		t.Fatal(err)
	}
	want := saga.BulkCounts{Selected: 30, Filed: 28, Pending: 28, Refused: map[string]int64{"changed": 1, "request_pending": 1}}
	if !sameCounts(b.Counts, want) || b.Filed == nil || b.Done() {
		t.Fatalf("after Apply: %+v (filed at %v), want %+v", b.Counts, b.Filed, want)
	}
	if again, err := p.Apply(ctx, plan.ID, by); err != nil || !sameCounts(again.Counts, want) {
		t.Fatalf("Apply again: %+v, %v; want it to file nothing more", again, err)
	}
	if in := s.Get(t, ids[0]); in.Revision != changed.Revision || in.Request != nil {
		t.Fatalf("the saga that changed was acted on: revision %d (was %d), request %+v", in.Revision, changed.Revision, in.Request)
	}
	// Filed, then changed before the orchestrator applies it: ids[2].
	// Filed, then withdrawn: ids[3].
	if _, err := s.O.Retry(ctx, ids[2], saga.Actor{Operator: "bob", Reason: "racing the bulk"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Withdraw(ctx, ids[3], saga.Actor{Operator: "carol", Reason: "not this one"}); err != nil {
		t.Fatal(err)
	}

	s.Fix.Store(true)
	b = drain(t, s.O, p, plan.ID)
	want = saga.BulkCounts{Selected: 30, Filed: 28, Applied: 26, Refused: map[string]int64{
		"changed": 2, "request_pending": 1, "withdrawn": 1}}
	if !sameCounts(b.Counts, want) {
		t.Fatalf("outcome: %+v, want %+v", b.Counts, want)
	}
	if b.Action != saga.ActionRetry || b.Operator != "alice" || b.Reason != "stock service fixed" || b.Query.Step != "reserve" || b.Query.Error != q.Error {
		t.Errorf("the operation as recorded: %+v", b)
	}
	for _, id := range ids[4:] {
		in := s.Get(t, id)
		if in.Status != saga.StatusCompensated {
			t.Errorf("saga %s is %s after the bulk retry, want compensated", id, in.Status)
		}
		var filed, applied bool
		for _, h := range historyOf(t, s.O, id) {
			var d struct {
				Operation string `json:"operation"`
			}
			_ = json.Unmarshal(h.Detail, &d)
			ok := h.Actor == "alice" && h.Reason == "stock service fixed" && d.Operation == plan.ID
			filed = filed || (h.Event == "operator_request" && ok)
			applied = applied || (h.Event == "operator" && ok)
		}
		if !filed || !applied {
			t.Errorf("saga %s: history lacks the bulk request (%v) or its application (%v) by alice naming operation %s", id, filed, applied, plan.ID)
		}
	}
	// The refused sagas were not acted on by the operation.
	for _, id := range ids[:4] {
		for _, h := range historyOf(t, s.O, id) {
			if h.Event == "operator" && h.Actor == "alice" {
				t.Errorf("saga %s was refused but the bulk retry acted on it: %+v", id, h)
			}
		}
	}
	refusal := historyEvents(t, s.O, ids[0], "operator_refused")
	if len(refusal) != 1 || refusal[0].Actor != "alice" {
		t.Errorf("the saga changed since the dry run has no refusal by alice in its history: %+v", refusal)
	}
	if _, err := p.BulkStatus(ctx, "no-such-operation"); !errors.Is(err, saga.ErrBulkNotFound) {
		t.Errorf("BulkStatus of an unknown id: %v", err)
	}
}

// Bulk plans and files in one call; a limit selects the newest sagas; an
// action the sagas' state refuses is refused at filing for every one.
func TestBulkLimitAndRefusal(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ctx := context.Background()
	ids := s.StuckRefunds(t, db, "refund", 10)
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	by := saga.Actor{Operator: "alice", Reason: "by hand"}
	// Skip is for a saga going forward; these are compensating.
	b, err := p.Bulk(ctx, saga.ActionSkip, saga.Query{Type: "refund", Limit: 4}, by)
	if err != nil {
		t.Fatal(err)
	}
	if want := (saga.BulkCounts{Selected: 4, Refused: map[string]int64{"not_allowed": 4}}); !sameCounts(b.Counts, want) || !b.Done() {
		t.Fatalf("bulk skip: %+v, want %+v", b.Counts, want)
	}
	if len(b.Sample) != 4 || b.Sample[0].ID != ids[9] || b.Sample[3].ID != ids[6] {
		t.Errorf("the limit selects the newest: sample %v", b.Sample)
	}
	if _, err := p.Bulk(ctx, saga.ActionRetry, saga.Query{Type: "refund"}, saga.Actor{Operator: "alice"}); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Errorf("bulk without a reason: %v, want ErrActionNotAllowed", err)
	}
	if _, err := p.Bulk(ctx, saga.Action("explode"), saga.Query{Type: "refund"}, by); !errors.Is(err, saga.ErrActionNotAllowed) {
		t.Errorf("bulk with an unknown action: %v, want ErrActionNotAllowed", err)
	}
}

func sameCounts(a, b saga.BulkCounts) bool {
	return a.Selected == b.Selected && a.Unfiled == b.Unfiled && a.Filed == b.Filed && a.Pending == b.Pending &&
		a.Applied == b.Applied && maps.Equal(a.Refused, b.Refused)
}

// Pause and resume by query: the running sagas a query selects are paused
// by the running orchestrator, each audited with the operation; a bulk
// resume brings them back; a stuck saga the query leaves out is untouched.
func TestBulkPauseAndResume(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	ctx := context.Background()
	var ships []string
	for i := range 5 {
		id := fmt.Sprintf("ship-%d", i)
		s.WaitingShip(t, id)
		ships = append(ships, id)
	}
	s.StuckRefund(t, "refund-1")
	p, err := saga.New(db.Pool, saga.Config{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	apply := func(action saga.Action, q saga.Query) *saga.BulkOperation {
		t.Helper()
		b, err := p.Bulk(ctx, action, q, saga.Actor{Operator: "alice", Reason: "carrier strike"})
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; {
			if _, err := s.O.RunDue(ctx); err != nil {
				t.Fatal(err)
			}
			if b, err = p.BulkStatus(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
			if b.Done() {
				return b
			}
			if time.Now().After(deadline) {
				t.Fatalf("bulk %s not applied: %+v", action, b.Counts)
			}
		}
	}
	b := apply(saga.ActionPause, saga.Query{Type: "ship", Status: saga.StatusRunning})
	pauseOp := b.ID
	if want := (saga.BulkCounts{Selected: 5, Filed: 5, Applied: 5}); !sameCounts(b.Counts, want) {
		t.Fatalf("bulk pause: %+v, want %+v", b.Counts, want)
	}
	for _, id := range ships {
		if in := s.Get(t, id); in.Status != saga.StatusPaused {
			t.Fatalf("saga %s is %s after the bulk pause", id, in.Status)
		}
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusStuck {
		t.Fatalf("the stuck saga the query left out is %s", in.Status)
	}
	b = apply(saga.ActionResume, saga.Query{Status: saga.StatusPaused})
	if want := (saga.BulkCounts{Selected: 5, Filed: 5, Applied: 5}); !sameCounts(b.Counts, want) {
		t.Fatalf("bulk resume: %+v, want %+v", b.Counts, want)
	}
	for _, id := range ships {
		in := s.Get(t, id)
		if in.Status != saga.StatusRunning {
			t.Fatalf("saga %s is %s after the bulk resume", id, in.Status)
		}
		paused, audited := false, false
		hist, err := s.O.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hist {
			paused = paused || h.Event == "paused" && h.Actor == "alice" && h.Reason == "carrier strike"
			audited = audited || strings.Contains(string(h.Detail), pauseOp)
		}
		if !paused || !audited {
			t.Errorf("saga %s: paused by alice %v, a line naming operation %s %v", id, paused, pauseOp, audited)
		}
	}
}
