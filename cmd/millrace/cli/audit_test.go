package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/audit"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
)

// cliWith runs the command against db's schema with cfg, USER=oncall.
func cliWith(t *testing.T, db *pgtest.DB, cfg Config, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	full := append([]string{"--database-url", pgtest.URL(), "--schema", db.Schema}, args...)
	code := Run(context.Background(), full, &stdout, &stderr, func(k string) string {
		if k == "USER" {
			return "oncall"
		}
		return ""
	}, cfg)
	return result{stdout.String(), stderr.String(), code}
}

// auditLines runs millrace audit list --json with args and decodes its
// JSON lines.
func auditLines(t *testing.T, db *pgtest.DB, args ...string) []audit.Record {
	t.Helper()
	out := ok(t, db, append([]string{"audit", "list", "--json"}, args...)...)
	var list []audit.Record
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit list --json: line %q: %v", sc.Text(), err)
		}
		list = append(list, r)
	}
	return list
}

// The command's actions land in the audit trail the console and Go code
// write: the outbox's and the inbox's dead letters (one by one and in
// bulk), a replay, and a saga action recorded as a request, each with the
// operator (--operator, else $USER), the reason and where from ("cli");
// millrace audit list reads it, as a table and as JSON lines, filtered.
func TestCLIActionsAreAudited(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	dead := opstest.OutboxDead(t, db, "orders", 3)
	inboxDead := opstest.InboxDead(t, db, "billing", 1)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")

	ok(t, db, "outbox", "dead", "requeue", dead[0], "--operator", "alice", "--reason", "topic created")
	ok(t, db, "outbox", "dead", "discard", "--topic", "orders", "--operator", "bob", "--reason", "obsolete")
	ok(t, db, "inbox", "dead", "discard", "--consumer", "billing", inboxDead[0], "--operator", "carol", "--reason", "order gone")
	ok(t, db, "outbox", "replay", "--topic", "orders", "--operator", "dave", "--reason", "rebuild")
	if r := cliWith(t, db, Config{}, "saga", "retry", "refund-1", "--reason", "stock fixed"); r.code != 0 {
		t.Fatalf("saga retry: %+v", r)
	}

	all := auditLines(t, db)
	var got []string
	for i := len(all) - 1; i >= 0; i-- {
		e := all[i]
		got = append(got, e.Operator+" "+e.Action+" "+e.Outcome+" "+e.Target)
		if !strings.HasPrefix(e.Source, "cli "+e.Operator+"@") {
			t.Errorf("entry %+v: from %q, want the command and the operator's host", e, e.Source)
		}
	}
	want := []string{"alice outbox.requeue done " + dead[0], "bob outbox.discard done " + dead[1], "bob outbox.discard done " + dead[2],
		"carol inbox.discard done " + inboxDead[0], "dave outbox.replay done ", "oncall saga.retry requested refund-1"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("audit trail:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if e := auditLines(t, db, "--operator", "bob"); len(e) != 2 || e[0].Reason != "obsolete" {
		t.Errorf("--operator bob: %+v", e)
	}
	if e := auditLines(t, db, "--target", "refund-1"); len(e) != 1 || e[0].Reason != "stock fixed" || e[0].Scope != "refund" {
		t.Errorf("--target refund-1: %+v", e)
	}
	if e := auditLines(t, db, "--action", "outbox", "--limit", "2"); len(e) != 2 || e[0].Action != "outbox.replay" {
		t.Errorf("--action outbox --limit 2: %+v", e)
	}
	out := ok(t, db, "audit", "list", "--action", "inbox")
	if !regexp.MustCompile(`AT\s+OPERATOR\s+ACTION\s+OUTCOME\s+RESOURCE\s+REASON\s+FROM\n.*carol\s+inbox\.discard\s+done\s+inbox billing ` +
		inboxDead[0] + `\s+order gone\s+cli carol@`).MatchString(out) {
		t.Errorf("audit list, human:\n%s", out)
	}
	fails(t, db, 2, `--limit must be in 1..1000`, "audit", "list", "--limit", "0")
}

// Every action needs a reason: from --reason, else asked for on the
// terminal (Config.Stdin), else it is refused as a usage error and
// nothing changes. The operator is --operator, else $USER.
func TestCLIReasonIsRequiredOrAsked(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	dead := opstest.OutboxDead(t, db, "orders", 2)

	r := cliWith(t, db, Config{}, "outbox", "dead", "requeue", dead[0])
	if r.code != exitUsage || !strings.Contains(r.stderr, "--reason is required") {
		t.Fatalf("requeue without a reason: %+v", r)
	}
	if s := outboxStatsOf(t, db); s.Dead != 2 {
		t.Fatalf("a refused requeue changed the dead letters: %+v", s)
	}
	fails(t, db, 2, `--operator is required when \$USER is not set`, "outbox", "dead", "requeue", dead[0], "--reason", "x")

	r = cliWith(t, db, Config{Stdin: strings.NewReader("the topic exists now\n")}, "outbox", "dead", "requeue", dead[0])
	if r.code != 0 || !strings.Contains(r.stderr, "Reason for requeue of 1 outbox dead letter(s)") {
		t.Fatalf("requeue with the reason asked for: %+v", r)
	}
	e := auditLines(t, db)
	if len(e) != 1 || e[0].Operator != "oncall" || e[0].Reason != "the topic exists now" {
		t.Fatalf("the asked-for reason is not on record: %+v", e)
	}
	// An empty answer is no reason.
	r = cliWith(t, db, Config{Stdin: strings.NewReader("\n")}, "outbox", "dead", "discard", dead[1])
	if r.code != exitUsage || !strings.Contains(r.stderr, "--reason is required") {
		t.Fatalf("discard with an empty reason: %+v", r)
	}
}

// Config.Authorize is asked before every action, with the operator and
// the resource; its refusal changes nothing and says why.
func TestCLIAuthorize(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	dead := opstest.OutboxDead(t, db, "orders", 1)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	var asked []string
	cfg := Config{Authorize: func(ctx context.Context, who console.Identity, action console.Action, res console.Resource) error {
		asked = append(asked, who.Name+" "+string(action)+" "+res.Kind+" "+res.ID+" "+res.Op)
		if who.Name != "lead" {
			return errors.New("only the lead acts today")
		}
		return nil
	}}
	for _, args := range [][]string{
		{"outbox", "dead", "discard", dead[0], "--reason", "x"},
		{"saga", "abort", "refund-1", "--reason", "x"},
	} {
		r := cliWith(t, db, cfg, args...)
		if r.code != exitFail || !strings.Contains(r.stderr, "forbidden: oncall may not") || !strings.Contains(r.stderr, "only the lead acts today") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	if s := outboxStatsOf(t, db); s.Dead != 1 {
		t.Errorf("a forbidden discard changed the dead letters: %+v", s)
	}
	if in := s.Get(t, "refund-1"); in.Request != nil {
		t.Errorf("a forbidden abort filed a request: %+v", in.Request)
	}
	if want := "oncall discard outbox " + dead[0] + " |oncall act saga refund-1 abort"; strings.Join(asked, "|") != want {
		t.Errorf("asked %q, want %q", asked, want)
	}
	if r := cliWith(t, db, cfg, "outbox", "dead", "discard", dead[0], "--reason", "x", "--operator", "lead"); r.code != 0 {
		t.Errorf("the lead's discard: %+v", r)
	}
}

// --redact replaces the named fields' values (or every value, "*") in the
// payloads the command prints: a saga's data and input in saga show (and
// its --json), and a dead letter's payload in --json; Config.Redact
// decides instead when set.
func TestCLIRedactsPayloads(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	opstest.InboxDead(t, db, "billing", 1)

	var show sagaShow
	okJSON(t, db, &show, "saga", "show", "refund-1", "--redact", "reserved")
	if compact(show.Saga.Data) != `{"id":"refund-1","reserved":"[redacted]"}` || compact(show.Saga.Input) != `{"id":"refund-1","reserved":"[redacted]"}` {
		t.Errorf("saga show --redact reserved: data %s, input %s", show.Saga.Data, show.Saga.Input)
	}
	out := ok(t, db, "saga", "show", "refund-1", "--redact", "*")
	if !strings.Contains(out, `data: {"id":"[redacted]","reserved":"[redacted]"}`) || strings.Contains(out, `"refund-1","reserved"`) {
		t.Errorf("saga show --redact '*':\n%s", out)
	}
	var list []inboxDeadLetter
	okJSON(t, db, &list, "inbox", "dead", "list", "--consumer", "billing", "--redact", "n")
	if len(list) != 1 || compact(list[0].Payload) != `{"n":"[redacted]"}` {
		t.Errorf("inbox dead list --redact n: %+v", list)
	}
	hide := Config{Redact: func(who console.Identity, res console.Resource, payload []byte) []byte {
		if who.Name == "oncall" && res.Kind == "inbox" {
			return nil
		}
		return payload
	}}
	r := cliWith(t, db, hide, "--json", "inbox", "dead", "list", "--consumer", "billing")
	list = nil
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].Payload != nil || !list[0].PayloadHidden {
		t.Errorf("Config.Redact hiding inbox payloads: %+v %v %q", list, err, r.stderr)
	}
}

// The standalone console believes identity headers only from the proxies
// --trusted-proxy names: a request from anywhere else gets no identity
// (401), whatever header it sends.
func TestConsoleCommandTrustsOnlyItsProxy(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--database-url", pgtest.URL(), "--schema", db.Schema, "console", "--listen", "127.0.0.1:0",
			"--trusted-proxy", "192.0.2.10"}, io.Discard, &stderr, func(string) string { return "" })
	}()
	addr := regexp.MustCompile(`listening on (http://\S+)`)
	var base string
	for deadline := time.Now().Add(30 * time.Second); ; {
		if m := addr.FindStringSubmatch(stderr.String()); m != nil {
			base = m[1]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("console did not start: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	req, err := http.NewRequest(http.MethodGet, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-User", "mallory")
	req.Header.Set("X-Forwarded-Groups", "admin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || strings.Contains(string(body), "mallory") || !strings.Contains(string(body), "not a trusted proxy") {
		t.Errorf("a request with identity headers from an untrusted address: %d\n%s", resp.StatusCode, body)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("console exit %d: %s", code, stderr.String())
	}
	http.DefaultClient.CloseIdleConnections()

}
