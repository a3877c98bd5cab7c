package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/saga"
)

// sagaCLI runs the command with the test sagas' definitions registered,
// as a binary built with them would.
func sagaCLI(t *testing.T, db *pgtest.DB, s *opstest.Sagas, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	full := append([]string{"--database-url", pgtest.URL(), "--schema", db.Schema}, args...)
	register := func(o *saga.Orchestrator) error { return o.Register(s.Refund, s.Ship) }
	code := Run(context.Background(), full, &stdout, &stderr, func(k string) string {
		if k == "USER" {
			return "oncall"
		}
		return ""
	}, Config{Sagas: register})
	return result{stdout.String(), stderr.String(), code}
}

func sagaOKJSON(t *testing.T, db *pgtest.DB, s *opstest.Sagas, v any, args ...string) {
	t.Helper()
	r := sagaCLI(t, db, s, append(args, "--json")...)
	if r.code != 0 {
		t.Fatalf("millrace %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("millrace %s --json: %v in %q", strings.Join(args, " "), err, r.stdout)
	}
}

func sagaFails(t *testing.T, db *pgtest.DB, s *opstest.Sagas, code int, want string, args ...string) {
	t.Helper()
	r := sagaCLI(t, db, s, args...)
	if r.code != code {
		t.Fatalf("millrace %s: exit %d, want %d; stdout %q stderr %q", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "millrace: ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("millrace %s: stderr %q is not one error line", strings.Join(args, " "), r.stderr)
	}
	if !regexp.MustCompile(want).MatchString(r.stderr) {
		t.Errorf("millrace %s: stderr %q does not match %q", strings.Join(args, " "), r.stderr, want)
	}
	if r.stdout != "" {
		t.Errorf("millrace %s failed but printed %q", strings.Join(args, " "), r.stdout)
	}
}

func TestSagaList(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	for i := range 3 {
		s.StuckRefund(t, fmt.Sprintf("refund-%d", i))
	}
	for i := range 2 {
		s.WaitingShip(t, fmt.Sprintf("ship-%d", i))
	}

	var all sagaList
	okJSON(t, db, &all, "saga", "list")
	if len(all.Sagas) != 5 || all.Next != "" {
		t.Fatalf("saga list: %d sagas, next %q; want 5 and no next page", len(all.Sagas), all.Next)
	}
	if all.Sagas[0].ID != "ship-1" || all.Sagas[4].ID != "refund-0" {
		t.Errorf("saga list is not newest first: %s ... %s", all.Sagas[0].ID, all.Sagas[4].ID)
	}

	var stuck sagaList
	okJSON(t, db, &stuck, "saga", "list", "--status", "stuck")
	for _, in := range stuck.Sagas {
		if in.Status != saga.StatusStuck || in.Type != "refund" || in.LastError == "" {
			t.Errorf("--status stuck lists %+v", in)
		}
	}
	if len(stuck.Sagas) != 3 {
		t.Errorf("--status stuck: %d sagas, want 3", len(stuck.Sagas))
	}
	var ships sagaList
	okJSON(t, db, &ships, "saga", "list", "--type", "ship")
	if len(ships.Sagas) != 2 || ships.Sagas[0].Type != "ship" || ships.Sagas[0].Step != "reserve" {
		t.Errorf("--type ship: %+v", ships.Sagas)
	}
	var old sagaList
	okJSON(t, db, &old, "saga", "list", "--older-than", "1h")
	if len(old.Sagas) != 0 {
		t.Errorf("--older-than 1h lists %d sagas started just now", len(old.Sagas))
	}

	// Pages of two walk the whole list once.
	var seen []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		var p sagaList
		args := []string{"saga", "list", "--limit", "2"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		okJSON(t, db, &p, args...)
		for _, in := range p.Sagas {
			seen = append(seen, in.ID)
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if strings.Join(seen, ",") != "ship-1,ship-0,refund-2,refund-1,refund-0" {
		t.Errorf("pages walk %v", seen)
	}

	human := ok(t, db, "saga", "list", "--limit", "2")
	for _, want := range []string{"ID", "STATUS", "ship-1", "running", "reserve", "next page: --cursor "} {
		if !strings.Contains(human, want) {
			t.Errorf("human list lacks %q:\n%s", want, human)
		}
	}

	fails(t, db, 2, `--status "lost": want one of running`, "saga", "list", "--status", "lost")
	fails(t, db, 2, `--cursor: saga: invalid list cursor`, "saga", "list", "--cursor", "!!")
	fails(t, db, 2, `--limit must be in 1..1000`, "saga", "list", "--limit", "0")
}

func TestSagaShow(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")

	var got sagaShow
	okJSON(t, db, &got, "saga", "show", "refund-1")
	in := got.Saga
	if in.ID != "refund-1" || in.Status != saga.StatusStuck || in.Phase != saga.PhaseCompensating || in.Step != "reserve" {
		t.Errorf("show: %+v", in)
	}
	if in.Steps["reserve"] == nil || in.Steps["charge"] == nil || in.Steps["charge"].Status != saga.StepFailed {
		t.Errorf("show: steps %v", in.Steps)
	}
	var data opstest.Order
	if err := json.Unmarshal(in.Data, &data); err != nil || !data.Reserved || data.ID != "refund-1" {
		t.Errorf("show: data %s (%v)", in.Data, err)
	}
	var events []string
	for _, h := range got.History {
		events = append(events, h.Event)
	}
	if len(events) < 3 || events[0] != "started" || events[len(events)-1] != "stuck" {
		t.Errorf("show: history %v, want started ... stuck", events)
	}

	human := ok(t, db, "saga", "show", "refund-1")
	for _, want := range []string{"refund v1", "stuck", "current step", "reserve", "charge", "card declined", `"reserved": true`, "last error: compensation of step reserve failed 1 times: stock service says: no such reservation", "EVENT", "started"} {
		if !strings.Contains(human, want) {
			t.Errorf("human show lacks %q:\n%s", want, human)
		}
	}
	fails(t, db, 1, `saga: not found: "nope"`, "saga", "show", "nope")
	fails(t, db, 2, `accepts 1 arg`, "saga", "show")
}

func TestSagaActions(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	s.StuckRefund(t, "refund-2")
	s.WaitingShip(t, "ship-1")
	s.WaitingShip(t, "ship-2")

	historyLen := func(id string) int {
		h, err := s.O.History(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return len(h)
	}
	unchanged := func(id string, before *saga.Instance, hist int) {
		t.Helper()
		after := s.Get(t, id)
		if after.Revision != before.Revision || after.Status != before.Status || historyLen(id) != hist {
			t.Errorf("a refused action changed saga %s: %s rev %d -> %s rev %d", id, before.Status, before.Revision, after.Status, after.Revision)
		}
	}

	// Refused by the saga's state: one line, nothing changes.
	before, hist := s.Get(t, "refund-1"), historyLen("refund-1")
	sagaFails(t, db, s, 1, `skip of saga "refund-1": saga: action not allowed: the saga is compensating`,
		"saga", "skip", "refund-1", "--reason", "done by hand")
	sagaFails(t, db, s, 1, `abort of saga "refund-1": saga: action not allowed: the saga is compensating already`,
		"saga", "abort", "refund-1", "--reason", "x")
	unchanged("refund-1", before, hist)
	before, hist = s.Get(t, "ship-1"), historyLen("ship-1")
	sagaFails(t, db, s, 1, `mark-compensated of saga "ship-1": saga: action not allowed: the saga is not compensating`,
		"saga", "mark-compensated", "ship-1", "--reason", "x")
	unchanged("ship-1", before, hist)
	sagaFails(t, db, s, 1, `saga: not found: "nope"`, "saga", "retry", "nope", "--reason", "x")
	sagaFails(t, db, s, 2, `--reason is required`, "saga", "retry", "refund-1")
	unchanged("refund-1", s.Get(t, "refund-1"), historyLen("refund-1"))

	// The stock binary has no definitions: a clear refusal, nothing changes.
	before, hist = s.Get(t, "refund-1"), historyLen("refund-1")
	fails(t, db, 1, `definition not registered: retry of saga "refund-1": refund v1: this millrace binary does not have the saga's definition`,
		"saga", "retry", "refund-1", "--reason", "x", "--operator", "bob")
	unchanged("refund-1", before, hist)

	// Retry once the stock service is fixed: the compensation runs, the
	// saga ends compensated, and the operator is on record.
	s.Fix.Store(true)
	var got sagaJSON
	sagaOKJSON(t, db, s, &got, "saga", "retry", "refund-1", "--reason", "stock fixed", "--operator", "alice")
	if got.Status != saga.StatusCompensated {
		t.Errorf("retry printed %s, want compensated", got.Status)
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusCompensated {
		t.Errorf("after retry the saga is %s", in.Status)
	}
	assertOperator(t, s, "refund-1", "retry", "alice", "stock fixed")

	// mark-compensated, with the operator from $USER; human output.
	r := sagaCLI(t, db, s, "saga", "mark-compensated", "refund-2", "--reason", "undone by hand")
	if r.code != 0 || !strings.Contains(r.stdout, "mark-compensated of saga refund-2 done by oncall: now compensated") {
		t.Errorf("mark-compensated: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	assertOperator(t, s, "refund-2", "mark-compensated", "oncall", "undone by hand")

	// skip a waiting step: the local pivot runs, the saga completes.
	sagaOKJSON(t, db, s, &got, "saga", "skip", "ship-1", "--reason", "reserved by phone")
	if got.Status != saga.StatusCompleted || got.Steps["reserve"].Status != saga.StepSkipped {
		t.Errorf("skip: %s, steps %v", got.Status, got.Steps)
	}
	// abort a waiting step: compensation of reserve is sent.
	sagaOKJSON(t, db, s, &got, "saga", "abort", "ship-2", "--reason", "customer cancelled")
	if got.Status != saga.StatusCompensating || got.Phase != saga.PhaseCompensating {
		t.Errorf("abort: %s/%s", got.Status, got.Phase)
	}
	assertOperator(t, s, "ship-2", "abort", "oncall", "customer cancelled")
	// An ended saga refuses every action.
	before, hist = s.Get(t, "ship-1"), historyLen("ship-1")
	sagaFails(t, db, s, 1, `retry of saga "ship-1": it has ended \(completed\)`, "saga", "retry", "ship-1", "--reason", "x")
	unchanged("ship-1", before, hist)
}

func assertOperator(t *testing.T, s *opstest.Sagas, id, action, operator, reason string) {
	t.Helper()
	hist, err := s.O.History(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hist {
		if h.Event == "operator" && h.Actor == operator && h.Reason == reason && strings.Contains(string(h.Detail), `"`+action+`"`) {
			return
		}
	}
	t.Errorf("saga %s: no operator entry %s by %s (%s) in its history", id, action, operator, reason)
}
