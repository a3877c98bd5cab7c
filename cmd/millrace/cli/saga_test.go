package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

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
	// The stuck refunds' last error names the stock service; the ships have
	// none. Both stand at step reserve.
	var byError sagaList
	okJSON(t, db, &byError, "saga", "list", "--step", "reserve", "--error", "%no such reservation%")
	if len(byError.Sagas) != 3 || byError.Sagas[0].Type != "refund" {
		t.Errorf("--step reserve --error: %+v", byError.Sagas)
	}
	var atReserve sagaList
	okJSON(t, db, &atReserve, "saga", "list", "--step", "reserve")
	if len(atReserve.Sagas) != 5 {
		t.Errorf("--step reserve: %d sagas, want 5", len(atReserve.Sagas))
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

	// A saga that ended is in no phase any more (it said "compensating").
	s.CompensatedBook(t, "book-1")
	human = ok(t, db, "saga", "show", "book-1")
	if !regexp.MustCompile(`(?m)^phase +ended$`).MatchString(human) {
		t.Errorf("a compensated saga's phase:\n%s", human)
	}
}

// A parent lists its child sagas, and a child names its parent.
func TestSagaShowChildren(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.ShippingParent(t, "trip-1")

	var got sagaShow
	okJSON(t, db, &got, "saga", "show", "trip-1")
	if len(got.Children) != 1 || got.Children[0].ID != "trip-1/shipping/1" || got.Children[0].Type != "ship" || got.Children[0].Status != saga.StatusRunning {
		t.Fatalf("children %+v", got.Children)
	}
	human := ok(t, db, "saga", "show", "trip-1")
	if !regexp.MustCompile(`(?m)^trip-1/shipping/1 +ship +running +reserve`).MatchString(human) {
		t.Errorf("human show lacks the child:\n%s", human)
	}
	okJSON(t, db, &got, "saga", "show", "trip-1/shipping/1")
	if got.Saga.Parent != "trip-1" || len(got.Children) != 0 {
		t.Fatalf("child: parent %q, children %+v", got.Saga.Parent, got.Children)
	}
	if human := ok(t, db, "saga", "show", "trip-1/shipping/1"); !strings.Contains(human, "parent: trip-1 (millrace saga show trip-1)") {
		t.Errorf("human show of the child lacks its parent:\n%s", human)
	}
}

// An event line says when its event arrived when that is not when the
// line was written.
func TestSagaShowArrival(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	line := func(arrived time.Time) saga.HistoryEntry {
		return saga.HistoryEntry{Event: "event", At: at, Detail: mustMarshal(t, map[string]any{"arrived_at": arrived})}
	}
	if got := arrival(line(at.Add(-time.Hour))); got != " (arrived 2026-01-01 11:00:00.000)" {
		t.Errorf("arrival an hour before: %q", got)
	}
	if got := arrival(line(at)); got != "" {
		t.Errorf("arrival at the line's time: %q", got)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
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

// The stock binary (no definitions) records an operator request that the
// service's running orchestrator applies.
func TestSagaRequestFromTheStockBinary(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	s.WaitingShip(t, "ship-1")
	s.WaitingShip(t, "ship-2")
	s.WaitingShip(t, "ship-3")
	s.WaitingShip(t, "ship-4")
	ctx := context.Background()
	historyLen := func(id string) int {
		h, err := s.O.History(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return len(h)
	}

	// Refused before anything is recorded: one line, nothing changes.
	before, hist := s.Get(t, "refund-1"), historyLen("refund-1")
	fails(t, db, 1, `skip of saga "refund-1": saga: action not allowed: the saga is compensating \(use MarkCompensated\)`,
		"saga", "skip", "refund-1", "--reason", "x", "--operator", "bob")
	fails(t, db, 1, `saga: not found: "nope"`, "saga", "retry", "nope", "--reason", "x", "--operator", "bob")
	fails(t, db, 2, `--wait must not be negative`, "saga", "retry", "refund-1", "--reason", "x", "--operator", "bob", "--wait", "-1s")
	if after := s.Get(t, "refund-1"); after.Revision != before.Revision || after.Request != nil || historyLen("refund-1") != hist {
		t.Fatalf("a refused request changed the saga: %+v", after.Request)
	}

	// Recorded, not applied: the saga stays stuck until the orchestrator
	// comes by.
	var got requestJSON
	okJSON(t, db, &got, "saga", "retry", "refund-1", "--reason", "stock fixed", "--operator", "alice")
	if got.Outcome != "pending" || got.Request.Action != saga.ActionRetry || got.Request.Operator != "alice" ||
		got.Request.Reason != "stock fixed" || got.Saga.Request == nil || got.Saga.Status != saga.StatusStuck {
		t.Fatalf("retry request printed %+v", got)
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusStuck || in.Request == nil {
		t.Fatalf("after the request: %s %+v", in.Status, in.Request)
	}
	out := ok(t, db, "saga", "show", "refund-1")
	if !strings.Contains(out, "pending operator request: retry by alice") {
		t.Errorf("saga show does not show the pending request:\n%s", out)
	}
	// One at a time.
	fails(t, db, 1, `an operator request is pending: retry of saga "refund-1" by alice`,
		"saga", "mark-compensated", "refund-1", "--reason", "x", "--operator", "bob")

	// The service's orchestrator applies it on its timer pass, as alice.
	s.Fix.Store(true)
	if n, err := s.O.RunDue(ctx); err != nil || n != 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	if in := s.Get(t, "refund-1"); in.Status != saga.StatusCompensated || in.Request != nil {
		t.Fatalf("after the orchestrator: %s %+v", in.Status, in.Request)
	}
	assertOperator(t, s, "refund-1", "retry", "alice", "stock fixed")

	// Human output says what happens next.
	r := cli(t, db, "saga", "skip", "ship-3", "--reason", "reserved by phone", "--operator", "dave")
	if r.code != 0 || !strings.Contains(r.stdout, "skip of saga ship-3 requested by dave: recorded; the service's running orchestrator applies it") {
		t.Errorf("skip: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	// --wait: the command waits for the orchestrator and prints the outcome.
	pump := func(args ...string) result {
		t.Helper()
		done := make(chan result, 1)
		go func() { done <- cli(t, db, args...) }()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case r := <-done:
				return r
			case <-tick.C:
				if _, err := s.O.RunDue(ctx); err != nil {
					t.Error(err)
				}
			}
		}
	}
	r = pump("saga", "abort", "ship-1", "--reason", "customer cancelled", "--operator", "carol", "--wait", "20s", "--json")
	if r.code != 0 {
		t.Fatalf("abort --wait: exit %d, %q", r.code, r.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	got = requestJSON{}
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("abort --wait --json: %v in %q", err, r.stdout)
	}
	if got.Outcome != "applied" || got.Saga.Status != saga.StatusCompensating || got.Saga.Request != nil {
		t.Errorf("abort --wait printed %+v", got)
	}
	assertOperator(t, s, "ship-1", "abort", "carol", "customer cancelled")

	// --wait with no orchestrator running: a clear error, the request
	// stays for when it runs.
	fails(t, db, 1, `recorded but not applied within 300ms: is the service's orchestrator running`,
		"saga", "retry", "ship-2", "--reason", "nudge", "--operator", "erin", "--wait", "300ms")
	if in := s.Get(t, "ship-2"); in.Request == nil || in.Request.Operator != "erin" {
		t.Fatalf("the request did not stay: %+v", in.Request)
	}
	// The saga moves on before the orchestrator applies it: refused when
	// applied, and --wait says so.
	if _, err := s.O.Skip(ctx, "ship-2", saga.Actor{Operator: "frank", Reason: "reserved by phone"}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.O.RunDue(ctx); err != nil || n < 1 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	if in := s.Get(t, "ship-2"); in.Status != saga.StatusCompleted || in.Request != nil {
		t.Fatalf("after a refused request: %s %+v", in.Status, in.Request)
	}
	var refused bool
	h, _ := s.O.History(ctx, "ship-2")
	for _, e := range h {
		refused = refused || (e.Event == "operator_refused" && e.Actor == "erin")
	}
	if !refused {
		t.Errorf("the refused request is not in the history: %+v", h)
	}

	// --wait reports a refusal as a one-line error.
	done := make(chan result, 1)
	go func() {
		done <- cli(t, db, "saga", "retry", "ship-4", "--reason", "nudge", "--operator", "gina", "--wait", "20s")
	}()
	deadline := time.Now().Add(20 * time.Second)
	for s.Get(t, "ship-4").Request == nil {
		if time.Now().After(deadline) {
			t.Fatal("the request was never recorded")
		}
		time.Sleep(10 * time.Millisecond) // polling the database for the CLI's write
	}
	if _, err := s.O.Skip(ctx, "ship-4", saga.Actor{Operator: "frank", Reason: "reserved by phone"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.O.RunDue(ctx); err != nil {
		t.Fatal(err)
	}
	r = <-done
	if r.code != 1 || r.stdout != "" || strings.Count(r.stderr, "\n") != 1 ||
		!strings.Contains(r.stderr, `retry of saga "ship-4" refused by the orchestrator when it came to apply it: saga: action not allowed: retry of saga "ship-4": it has ended (completed)`) {
		t.Errorf("--wait on a refused request: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// saga withdraw withdraws a pending request: the orchestrator then has
// nothing to apply, and the withdrawal is in the history.
func TestSagaWithdrawRequest(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-w")
	ctx := context.Background()
	fails(t, db, 1, `saga: no operator request is pending: saga "refund-w"`,
		"saga", "withdraw", "refund-w", "--reason", "x", "--operator", "bob")
	fails(t, db, 2, `--reason is required`, "saga", "withdraw", "refund-w", "--operator", "bob")
	ok(t, db, "saga", "retry", "refund-w", "--reason", "stock fixed", "--operator", "alice")

	r := cli(t, db, "saga", "withdraw", "refund-w", "--reason", "not fixed after all", "--operator", "bob")
	if r.code != 0 || !strings.Contains(r.stdout, "retry of saga refund-w requested by alice at ") ||
		!strings.Contains(r.stdout, "withdrawn by bob; the saga is stuck") {
		t.Fatalf("withdraw: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if in := s.Get(t, "refund-w"); in.Request != nil || in.Status != saga.StatusStuck {
		t.Fatalf("after withdraw: %s %+v", in.Status, in.Request)
	}
	if n, err := s.O.RunDue(ctx); err != nil || n != 0 {
		t.Fatalf("RunDue after withdraw: %d, %v", n, err)
	}
	var withdrawn bool
	h, _ := s.O.History(ctx, "refund-w")
	for _, e := range h {
		withdrawn = withdrawn || (e.Event == "operator_withdrawn" && e.Actor == "bob" && e.Reason == "not fixed after all")
	}
	if !withdrawn {
		t.Errorf("the withdrawal is not in the history: %+v", h)
	}

	// --json, and a binary with the definitions withdraws the same way.
	ok(t, db, "saga", "retry", "refund-w", "--reason", "again", "--operator", "alice")
	var got withdrawJSON
	sagaOKJSON(t, db, s, &got, "saga", "withdraw", "refund-w", "--reason", "no", "--operator", "carol")
	if got.Withdrawn.Action != saga.ActionRetry || got.Withdrawn.Operator != "alice" || got.Saga.Request != nil {
		t.Fatalf("withdraw --json printed %+v", got)
	}
}

// saga pause and resume: with the definitions they act at once, refused in
// the wrong state; from the stock binary they are requests the running
// orchestrator applies. Both record who and why; list filters by paused.
func TestSagaPauseResume(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.WaitingShip(t, "ship-1")
	s.WaitingShip(t, "ship-2")
	s.StuckRefund(t, "refund-1")

	sagaFails(t, db, s, 1, `resume of saga "ship-1": saga: action not allowed: the saga is not paused \(it is running\)`,
		"saga", "resume", "ship-1", "--reason", "x")
	sagaFails(t, db, s, 1, `pause of saga "refund-1": saga: action not allowed: only a running or compensating saga can be paused \(it is stuck\)`,
		"saga", "pause", "refund-1", "--reason", "x")
	var got sagaJSON
	sagaOKJSON(t, db, s, &got, "saga", "pause", "ship-1", "--reason", "warehouse audit", "--operator", "alice")
	if got.Status != saga.StatusPaused {
		t.Fatalf("pause printed %s", got.Status)
	}
	assertOperator(t, s, "ship-1", "pause", "alice", "warehouse audit")
	var list sagaList
	okJSON(t, db, &list, "saga", "list", "--status", "paused")
	if len(list.Sagas) != 1 || list.Sagas[0].ID != "ship-1" {
		t.Fatalf("list --status paused: %+v", list.Sagas)
	}
	sagaFails(t, db, s, 1, `retry of saga "ship-1": saga: action not allowed: the saga is paused \(use Resume first\)`,
		"saga", "retry", "ship-1", "--reason", "x")
	sagaOKJSON(t, db, s, &got, "saga", "resume", "ship-1", "--reason", "audit done", "--operator", "bob")
	if got.Status != saga.StatusRunning {
		t.Fatalf("resume printed %s", got.Status)
	}
	assertOperator(t, s, "ship-1", "resume", "bob", "audit done")

	// The stock binary records requests.
	r := cli(t, db, "saga", "pause", "ship-2", "--reason", "audit", "--operator", "carol")
	if r.code != 0 || !strings.Contains(r.stdout, "pause of saga ship-2 requested by carol: recorded") {
		t.Fatalf("pause request: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	if in := s.Get(t, "ship-2"); in.Status != saga.StatusPaused {
		t.Fatalf("after the pause request: %s", in.Status)
	}
	assertOperator(t, s, "ship-2", "pause", "carol", "audit")
	fails(t, db, 1, `pause of saga "ship-2": saga: action not allowed: only a running or compensating saga can be paused \(it is paused\)`,
		"saga", "pause", "ship-2", "--reason", "x", "--operator", "carol")
	ok(t, db, "saga", "resume", "ship-2", "--reason", "done", "--operator", "dave")
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	if in := s.Get(t, "ship-2"); in.Status != saga.StatusRunning {
		t.Fatalf("after the resume request: %s", in.Status)
	}
	assertOperator(t, s, "ship-2", "resume", "dave", "done")
}

// saga list --attr filters by the sagas' search attributes; a filter it
// cannot read is a usage error. The bulk selection takes the same.
func TestSagaListByAttributes(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefundOf(t, opstest.Order{ID: "ada-1", Customer: "ada", Amount: 120})
	s.StuckRefundOf(t, opstest.Order{ID: "ada-2", Customer: "ada", Amount: 50})
	s.StuckRefundOf(t, opstest.Order{ID: "bob-1", Customer: "bob", Amount: 300})
	var l sagaList
	okJSON(t, db, &l, "saga", "list", "--attr", "customer=ada", "--attr", "amount>100")
	if len(l.Sagas) != 1 || l.Sagas[0].ID != "ada-1" {
		t.Fatalf("saga list --attr customer=ada --attr amount>100: %+v", l.Sagas)
	}
	fails(t, db, exitUsage, `--attr: .*"amount>abc"`, "saga", "list", "--attr", "amount>abc")
	var show sagaShow
	okJSON(t, db, &show, "saga", "show", "ada-1")
	if a := show.Saga.Attributes; a["customer"] != "ada" || a["amount"] != "120" {
		t.Fatalf("saga show's attributes %v", a)
	}
	if out := ok(t, db, "saga", "show", "ada-1"); !strings.Contains(out, "keys and attributes: amount=120 customer=ada") {
		t.Fatalf("saga show lacks the attributes:\n%s", out)
	}
	var dry bulkDryRunJSON
	okJSON(t, db, &dry, "saga", "retry", "--status", "stuck", "--attr", "customer=ada", "--dry-run")
	if dry.Count != 2 {
		t.Fatalf("dry run of Ada's stuck sagas: %d, want 2", dry.Count)
	}
	fails(t, db, exitUsage, `customer<ada`, "saga", "retry", "--attr", "customer<ada", "--dry-run")
}

// saga signal sends an event by saga id or by key: the stock binary (no
// definitions) stores it for the service's orchestrator, which applies it;
// a signal to an ended saga, or by a key nobody holds, is refused.
func TestSagaSignal(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.WaitingPay(t, opstest.Order{ID: "pay-1", PaymentID: "pi-1"})
	s.WaitingPay(t, opstest.Order{ID: "pay-2", PaymentID: "pi-2"})
	var out signalJSON
	okJSON(t, db, &out, "saga", "signal", "pay-1", "payment.confirmed", "--payload", `{"ref":"phone"}`, "--event-id", "e-1", "--reason", "webhook lost", "--operator", "alice")
	if out.EventID != "e-1" || out.Saga == nil || out.Saga.ID != "pay-1" {
		t.Fatalf("saga signal: %+v", out)
	}
	okJSON(t, db, &out, "saga", "signal", "payment.confirmed", "--key", "payment_id=pi-2", "--type", "pay", "--payload", `{"ref":"key"}`, "--reason", "webhook lost", "--operator", "alice")
	if out.EventID == "" || out.Key != "payment_id" || out.Value != "pi-2" {
		t.Fatalf("saga signal by key: %+v", out)
	}
	if _, err := s.O.RunDue(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id, ref := range map[string]string{"pay-1": "phone", "pay-2": "key"} {
		in := s.Get(t, id)
		var o opstest.Order
		if err := json.Unmarshal(in.Data, &o); err != nil {
			t.Fatal(err)
		}
		if in.Status != saga.StatusCompleted || o.Paid != ref {
			t.Fatalf("%s: %s, paid %q; want completed, %q", id, in.Status, o.Paid, ref)
		}
	}
	fails(t, db, 1, `has ended`, "saga", "signal", "pay-1", "payment.confirmed", "--event-id", "e-2", "--reason", "again", "--operator", "alice")
	fails(t, db, 1, `no running saga`, "saga", "signal", "payment.confirmed", "--key", "payment_id=pi-9", "--type", "pay", "--reason", "x", "--operator", "alice")
	fails(t, db, exitUsage, `--payload`, "saga", "signal", "pay-1", "payment.confirmed", "--payload", "{", "--reason", "x")
	fails(t, db, exitUsage, `--key`, "saga", "signal", "pay-1", "payment.confirmed", "--key", "payment_id=pi-2", "--type", "pay", "--reason", "x", "--operator", "alice")
}
