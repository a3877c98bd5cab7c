package audit_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/pgtest"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// An entry is written in the action's transaction: rolled back, it is
// gone with the action; committed, it is listed newest first with who,
// on whose plan, why, from where, what and the states, and found by each
// filter.
func TestWriteAndList(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	trail := audit.New(db.Schema)
	alice := core.Actor{Operator: "alice", Reason: "stock service fixed", From: "console 203.0.113.7"}

	err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := trail.Write(ctx, tx, audit.Entry{Actor: alice, Action: "saga.retry", Kind: audit.KindSaga, Target: "s-1"}); err != nil {
			return err
		}
		return errors.New("the action failed")
	})
	if err == nil || err.Error() != "the action failed" {
		t.Fatal(err)
	}
	if list := list(t, trail, db, audit.Filter{}); len(list) != 0 {
		t.Fatalf("a rolled-back action left %d audit entries", len(list))
	}

	bob := core.Actor{Operator: "bob", OnBehalfOf: "alice", Reason: "line one\nline\x00two", Operation: "op-1"}
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if err := trail.Write(ctx, tx, audit.Entry{Actor: alice, Action: "saga.retry", Kind: audit.KindSaga, Scope: "refund",
			Target: "s-1", Before: map[string]any{"status": "stuck", "revision": 4}, After: map[string]any{"status": "running", "revision": 5}}); err != nil {
			return err
		}
		return trail.Write(ctx, tx,
			audit.Entry{Actor: bob, Action: "saga.abort", Outcome: audit.Requested, Kind: audit.KindSaga, Target: "s-2",
				Detail: map[string]string{"error": "nul \x00 here"}},
			audit.Entry{Actor: bob, Action: "saga.abort", Outcome: audit.Refused, Kind: audit.KindSaga, Target: "s-3"},
			audit.Entry{Actor: core.Actor{Operator: "carol", Reason: "replayed"}, Action: "outbox.requeue", Kind: audit.KindOutbox,
				Target: "e-1", Detail: json(`{"topic":"orders"}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	all := list(t, trail, db, audit.Filter{})
	if len(all) != 4 {
		t.Fatalf("%d entries, want 4", len(all))
	}
	first, last := all[3], all[0]
	if first.Operator != "alice" || first.Source != "console 203.0.113.7" || first.Action != "saga.retry" || first.Outcome != audit.Done ||
		first.Scope != "refund" || string(first.Before) != `{"status": "stuck", "revision": 4}` || string(first.After) != `{"status": "running", "revision": 5}` ||
		time.Since(first.At) > time.Minute {
		t.Errorf("first entry %+v", first)
	}
	if last.Operator != "carol" || last.Source != "go" || last.Kind != audit.KindOutbox || string(last.Detail) != `{"topic": "orders"}` {
		t.Errorf("newest entry %+v (want carol's, source go by default)", last)
	}
	if e := all[2]; e.Operator != "bob" || e.OnBehalfOf != "alice" || e.Operation != "op-1" || e.Reason != "line one line\uFFFDtwo" ||
		e.Outcome != audit.Requested || !strings.Contains(string(e.Detail), "\uFFFD") {
		t.Errorf("bob's entry %+v", e)
	}

	for name, c := range map[string]struct {
		f    audit.Filter
		want int
	}{
		"target":       {audit.Filter{Target: "s-1"}, 1},
		"operation":    {audit.Filter{Operation: "op-1"}, 2},
		"operator":     {audit.Filter{Operator: "bob"}, 2},
		"on behalf of": {audit.Filter{Operator: "alice"}, 3},
		"action":       {audit.Filter{Action: "saga.abort"}, 2},
		"family":       {audit.Filter{Action: "saga"}, 3},
		"no family":    {audit.Filter{Action: "sag"}, 0},
		"since":        {audit.Filter{Since: time.Now().Add(time.Hour)}, 0},
		"page":         {audit.Filter{Limit: 2}, 2},
		"next page":    {audit.Filter{Before: all[1].ID}, 2},
	} {
		if got := list(t, trail, db, c.f); len(got) != c.want {
			t.Errorf("%s: %d entries, want %d", name, len(got), c.want)
		}
	}
}

// An entry without an operator or a reason is refused, and nothing is
// written.
func TestWriteNeedsAnActor(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	trail := audit.New(db.Schema)
	for _, by := range []core.Actor{{}, {Operator: "alice"}, {Reason: "why"}, {Operator: " ", Reason: "why"}} {
		err := trail.Write(context.Background(), db.Pool, audit.Entry{Actor: by, Action: "outbox.discard", Kind: audit.KindOutbox})
		if !errors.Is(err, core.ErrNoActor) {
			t.Errorf("%+v: %v, want ErrNoActor", by, err)
		}
	}
	if got := list(t, trail, db, audit.Filter{}); len(got) != 0 {
		t.Errorf("refused entries were written: %+v", got)
	}
}

// The counter counts by source, kind, action and outcome, and registers on
// one Registerer any number of times.
func TestCount(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := audit.Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	e := audit.Entry{Actor: core.Actor{Operator: "a", Reason: "r", From: "cli a@host"}, Action: "inbox.discard.test", Kind: audit.KindInbox}
	audit.Count(e, e)
	n, err := testutil.GatherAndCount(reg, "millrace_audit_actions_total")
	if err != nil || n == 0 {
		t.Fatalf("gathered %d series, %v", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == "inbox.discard.test" {
				if labels["source"] != "cli" || labels["outcome"] != "done" || m.Counter.GetValue() != 2 {
					t.Errorf("series %v = %v, want source cli, outcome done, 2", labels, m.Counter.GetValue())
				}
				return
			}
		}
	}
	t.Error("no series for the counted action")
}

func list(t *testing.T, trail *audit.Trail, db *pgtest.DB, f audit.Filter) []audit.Record {
	t.Helper()
	out, err := trail.List(context.Background(), db.Pool, f)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func json(s string) []byte { return []byte(s) }
