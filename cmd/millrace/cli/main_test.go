package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
	"github.com/millrace/millrace/internal/leaktest"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/migrations"
	"github.com/millrace/millrace/outbox"
	"github.com/millrace/millrace/saga"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// result is one run of the command.
type result struct {
	stdout, stderr string
	code           int
}

// cli runs the command against db's schema, with no DATABASE_URL in its
// environment.
func cli(t *testing.T, db *pgtest.DB, args ...string) result {
	t.Helper()
	return cliCtx(context.Background(), t, db, args...)
}

func cliCtx(ctx context.Context, t *testing.T, db *pgtest.DB, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	full := append([]string{"--database-url", pgtest.URL(), "--schema", db.Schema}, args...)
	code := run(ctx, full, &stdout, &stderr, func(string) string { return "" })
	return result{stdout.String(), stderr.String(), code}
}

// ok runs the command and fails the test unless it succeeds.
func ok(t *testing.T, db *pgtest.DB, args ...string) string {
	t.Helper()
	r := cli(t, db, args...)
	if r.code != 0 {
		t.Fatalf("millrace %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// okJSON runs the command with --json and decodes its output into v.
func okJSON(t *testing.T, db *pgtest.DB, v any, args ...string) {
	t.Helper()
	out := ok(t, db, append(args, "--json")...)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("millrace %s --json: %v in %q", strings.Join(args, " "), err, out)
	}
}

// fails runs the command and checks it fails with exit status code and a
// one-line error on stderr that matches want.
func fails(t *testing.T, db *pgtest.DB, code int, want string, args ...string) {
	t.Helper()
	r := cli(t, db, args...)
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

func compact(raw []byte) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return err.Error()
	}
	return b.String()
}

func outboxStatsOf(t *testing.T, db *pgtest.DB) outbox.Stats {
	t.Helper()
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	s, err := admin.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMigrate(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true})
	latest := migrations.Latest()

	var st migrateStatus
	okJSON(t, db, &st, "migrate", "status")
	if st.Version != 0 || st.Latest != latest || len(st.Migrations) != latest {
		t.Fatalf("status before up = %+v", st)
	}
	for _, m := range st.Migrations {
		if m.State != "pending" {
			t.Errorf("before up, migration %d is %s", m.Version, m.State)
		}
	}
	fails(t, db, 1, `pending \[1 2`, "migrate", "validate")

	var up migrateResult
	okJSON(t, db, &up, "migrate", "up")
	if up.From != 0 || up.To != latest || len(up.Applied) != latest || up.Schema != db.Schema {
		t.Fatalf("up = %+v", up)
	}
	if out := ok(t, db, "migrate", "validate"); !strings.Contains(out, "is valid at version") {
		t.Errorf("validate printed %q", out)
	}
	okJSON(t, db, &up, "migrate", "up")
	if len(up.Applied) != 0 || up.To != latest {
		t.Errorf("second up = %+v, want nothing applied", up)
	}
	out := ok(t, db, "migrate", "status")
	if !regexp.MustCompile(`(?m)^1\s+outbox\s+applied$`).MatchString(out) || !strings.Contains(out, fmt.Sprintf("version %d, latest known %d", latest, latest)) {
		t.Errorf("human status:\n%s", out)
	}

	// Bad input changes nothing.
	fails(t, db, 2, `--to 99: known versions are 0\.\.`, "migrate", "down", "--to", "99")
	fails(t, db, 2, `--to -1`, "migrate", "down", "--to", "-1")
	fails(t, db, 2, `invalid argument "x"`, "migrate", "down", "--to", "x")
	okJSON(t, db, &st, "migrate", "status")
	if st.Version != latest {
		t.Fatalf("after refused downs, version %d, want %d", st.Version, latest)
	}

	var down migrateResult
	okJSON(t, db, &down, "migrate", "down")
	if down.From != latest || down.To != latest-1 || !slices.Equal(down.Applied, []int{latest}) {
		t.Errorf("down (one step) = %+v", down)
	}
	okJSON(t, db, &st, "migrate", "status")
	if st.Migrations[latest-1].State != "pending" || st.Migrations[0].State != "applied" {
		t.Errorf("status after one down = %+v", st.Migrations)
	}
	okJSON(t, db, &down, "migrate", "down", "--to", "0")
	if down.To != 0 {
		t.Errorf("down --to 0 = %+v", down)
	}
	fails(t, db, 1, "nothing to revert", "migrate", "down")
	if out := ok(t, db, "migrate", "up"); !strings.Contains(out, fmt.Sprintf("version 0 -> %d", latest)) {
		t.Errorf("up printed %q", out)
	}

	// A schema whose migration record does not match the code.
	if _, err := db.Pool.Exec(context.Background(), `UPDATE `+db.Schema+`.schema_migration SET checksum = 'x' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	fails(t, db, 1, `changed \[1\]`, "migrate", "validate")
	okJSON(t, db, &st, "migrate", "status")
	if st.Migrations[0].State != "changed" {
		t.Errorf("status of a changed migration = %+v", st.Migrations[0])
	}
}

func TestOutboxStats(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	var s outboxStats
	okJSON(t, db, &s, "outbox", "stats")
	if s != (outboxStats{}) {
		t.Errorf("stats of an empty outbox = %+v", s)
	}
	opstest.OutboxDead(t, db, "orders", 2)
	opstest.Write(t, db, "orders", 3)
	okJSON(t, db, &s, "outbox", "stats")
	if s.Pending != 3 || s.Dead != 2 || s.Blocked != 0 || s.PendingEstimated || s.OldestPendingAgeSeconds <= 0 {
		t.Errorf("stats = %+v, want 3 pending, 2 dead", s)
	}
	out := ok(t, db, "outbox", "stats")
	if !regexp.MustCompile(`PENDING\s+BLOCKED\s+DEAD\s+OLDEST PENDING\n3\s+0\s+2\s+\S+`).MatchString(out) {
		t.Errorf("human stats:\n%s", out)
	}
}

func TestOutboxDeadList(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	orders := opstest.OutboxDead(t, db, "orders", 3)
	payments := opstest.OutboxDead(t, db, "payments", 1)

	var all []outboxDeadLetter
	okJSON(t, db, &all, "outbox", "dead", "list")
	if len(all) != 4 {
		t.Fatalf("listed %d dead letters, want 4", len(all))
	}
	d := all[0]
	if d.EventID != orders[0] || d.Topic != "orders" || d.LastError != opstest.Refusal || d.Attempts != 1 ||
		d.EventType != "OrderPlaced" || d.AggregateType != "order" || d.DeadAt.IsZero() || d.CreatedAt.IsZero() ||
		compact(d.Payload) != `{"n":0}` || d.PayloadBase64 != "" || d.ID <= 0 {
		t.Errorf("first dead letter = %+v", d)
	}

	// Pages.
	var page1, page2 []outboxDeadLetter
	okJSON(t, db, &page1, "outbox", "dead", "list", "--limit", "3")
	okJSON(t, db, &page2, "outbox", "dead", "list", "--limit", "3", "--after", fmt.Sprint(page1[2].ID))
	if len(page1) != 3 || len(page2) != 1 || page2[0].EventID != payments[0] {
		t.Errorf("pages = %d + %d dead letters, want 3 + 1 (the payments one)", len(page1), len(page2))
	}
	// Filters.
	var byTopic, byKey []outboxDeadLetter
	okJSON(t, db, &byTopic, "outbox", "dead", "list", "--topic", "payments")
	okJSON(t, db, &byKey, "outbox", "dead", "list", "--key", all[1].PartitionKey)
	if len(byTopic) != 1 || byTopic[0].EventID != payments[0] || len(byKey) != 1 || byKey[0].EventID != orders[1] {
		t.Errorf("by topic %v, by key %v", byTopic, byKey)
	}

	out := ok(t, db, "outbox", "dead", "list", "--limit", "2")
	if !regexp.MustCompile(`EVENT ID\s+ID\s+TOPIC\s+KEY\s+TYPE\s+ATTEMPTS\s+DEAD FOR\s+LAST ERROR\n`+orders[0]+`\s+\d+\s+orders\s+order-0-\S+\s+OrderPlaced\s+1\s+\S+\s+broker refused`).MatchString(out) ||
		!strings.Contains(out, fmt.Sprintf("more may follow: --after %d", all[1].ID)) {
		t.Errorf("human list:\n%s", out)
	}

	fails(t, db, 2, "--limit must be positive", "outbox", "dead", "list", "--limit", "0")
	fails(t, db, 2, `invalid argument "x" for "--after"`, "outbox", "dead", "list", "--after", "x")
	fails(t, db, 2, `unknown flag: --nope`, "outbox", "dead", "list", "--nope")
	fails(t, db, 2, `unknown command "lsit" for "millrace outbox dead"`, "outbox", "dead", "lsit")
	fails(t, db, 2, `millrace outbox dead needs a subcommand: discard, list, requeue`, "outbox", "dead")
}

func TestOutboxDeadRequeueDiscard(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := opstest.OutboxDead(t, db, "orders", 4)

	var r actionResult
	okJSON(t, db, &r, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", ids[0], ids[1])
	if r.Action != "requeue" || r.Count != 2 || !slices.Equal(r.EventIDs, ids[:2]) {
		t.Errorf("requeue = %+v", r)
	}
	if s := outboxStatsOf(t, db); s.Dead != 2 || s.Pending != 2 {
		t.Errorf("after requeue of 2, stats %+v; want 2 dead, 2 pending", s)
	}
	if out := ok(t, db, "outbox", "dead", "discard", "--operator", "ops", "--reason", "test", ids[2]); out != "discarded 1 outbox dead letter\n" {
		t.Errorf("discard printed %q", out)
	}
	if s := outboxStatsOf(t, db); s.Dead != 1 || s.Pending != 2 {
		t.Errorf("after discard, stats %+v; want 1 dead, 2 pending", s)
	}
	var left []outboxDeadLetter
	okJSON(t, db, &left, "outbox", "dead", "list")
	if len(left) != 1 || left[0].EventID != ids[3] {
		t.Errorf("left %v, want only %s", left, ids[3])
	}
}

// Bad ids change nothing: not even the good ids named beside them.
func TestOutboxDeadBadInput(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := opstest.OutboxDead(t, db, "orders", 2)
	unknown := "0192f5c4-0000-7000-8000-000000000000"

	fails(t, db, 2, `event id "nope" is not a UUID`, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", ids[0], "nope")
	fails(t, db, 1, `event `+unknown+` is not an outbox dead letter .* nothing changed\n$`, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", ids[0], unknown)
	fails(t, db, 1, `event `+unknown+` is not an outbox dead letter`, "outbox", "dead", "discard", "--operator", "ops", "--reason", "test", unknown, ids[1])
	fails(t, db, 2, `give event ids, or select dead letters`, "outbox", "dead", "requeue")
	if s := outboxStatsOf(t, db); s.Dead != 2 || s.Pending != 0 {
		t.Fatalf("after refused commands, stats %+v; want both still dead", s)
	}
	// Acting twice on the same dead letter: the second time it is no longer one.
	ok(t, db, "outbox", "dead", "requeue", "--operator", "ops", "--reason", "test", ids[0])
	fails(t, db, 1, `event `+ids[0]+` is not an outbox dead letter \(unknown id, or already requeued or discarded\)`, "outbox", "dead", "discard", "--operator", "ops", "--reason", "test", ids[0])
	// The same id twice counts once.
	var r actionResult
	okJSON(t, db, &r, "outbox", "dead", "discard", "--operator", "ops", "--reason", "test", ids[1], strings.ToUpper(ids[1]))
	if r.Count != 1 {
		t.Errorf("discard of one id given twice = %+v", r)
	}
}

func TestOutboxReplay(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	opstest.Write(t, db, "orders", 3)
	opstest.Write(t, db, "payments", 2)
	pub := &opstest.Accept{}
	opstest.Relay(t, db, pub, func(s outbox.Stats) bool { return s.Pending == 0 })

	// Bad filters are refused before anything is queued.
	fails(t, db, 2, "invalid replay filter: it is empty", "outbox", "replay")
	fails(t, db, 2, `invalid replay filter: ToID 1 is below FromID 5`, "outbox", "replay", "--operator", "ops", "--reason", "test", "--from-id", "5", "--to-id", "1")
	fails(t, db, 2, `--from "yesterday": want a time like`, "outbox", "replay", "--operator", "ops", "--reason", "test", "--from", "yesterday")
	fails(t, db, 2, `invalid replay filter: To .* is not after From`, "outbox", "replay", "--operator", "ops", "--reason", "test", "--from", "2026-11-30", "--to", "2026-11-29")
	if s := outboxStatsOf(t, db); s.Pending != 0 {
		t.Fatalf("refused replays queued %d events", s.Pending)
	}

	var r map[string]int64
	okJSON(t, db, &r, "outbox", "replay", "--operator", "ops", "--reason", "test", "--topic", "orders")
	if r["queued"] != 3 {
		t.Errorf("replay --topic orders = %v, want 3 queued", r)
	}
	if s := outboxStatsOf(t, db); s.Pending != 3 {
		t.Errorf("after replay, %d pending, want 3", s.Pending)
	}
	okJSON(t, db, &r, "outbox", "replay", "--operator", "ops", "--reason", "test", "--event-type", "OrderPlaced", "--aggregate-id", "order-1", "--topic", "payments")
	if r["queued"] != 1 {
		t.Errorf("replay of one payments event = %v", r)
	}
	// A time window that holds nothing.
	okJSON(t, db, &r, "outbox", "replay", "--operator", "ops", "--reason", "test", "--to", "2001-01-01")
	if r["queued"] != 0 {
		t.Errorf("replay of events before 2001 = %v", r)
	}
	if out := ok(t, db, "outbox", "replay", "--operator", "ops", "--reason", "test", "--all"); out != "queued 1 events for publishing again\n" {
		t.Errorf("replay --all printed %q (the other 4 are queued already)", out)
	}
}

func TestInboxDead(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ids := opstest.InboxDead(t, db, "billing", 3)
	other := opstest.InboxDead(t, db, "shipping", 1)

	var list []inboxDeadLetter
	okJSON(t, db, &list, "inbox", "dead", "list", "--consumer", "billing")
	if len(list) != 3 || list[0].EventID != ids[0] || list[0].LastError != opstest.InboxFailure ||
		list[0].Consumer != "billing" || list[0].Attempts != 1 || compact(list[0].Payload) != `{"n":0}` || list[0].DeadAt.IsZero() {
		t.Fatalf("billing dead letters = %+v", list)
	}
	okJSON(t, db, &list, "inbox", "dead", "list", "--consumer", "billing", "--limit", "1")
	if len(list) != 1 {
		t.Errorf("--limit 1 listed %d", len(list))
	}
	out := ok(t, db, "inbox", "dead", "list", "--consumer", "shipping")
	if !regexp.MustCompile(`EVENT ID\s+TOPIC\s+KEY\s+ATTEMPTS\s+DEAD FOR\s+LAST ERROR\n` + other[0] + `\s+-\s+-\s+1\s+\S+\s+handler: order not found`).MatchString(out) {
		t.Errorf("human list:\n%s", out)
	}

	// Bad input changes nothing.
	fails(t, db, 2, `--consumer is required`, "inbox", "dead", "list")
	fails(t, db, 2, `event id "x" is not a UUID`, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", ids[0], "x")
	fails(t, db, 1, `event `+other[0]+` is not a dead letter of consumer "billing".*nothing changed`,
		"inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", ids[0], other[0])
	fails(t, db, 2, "--consumer is required", "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--consumer", "", ids[0])
	dl, err := inbox.NewDeadLetters(db.Pool, inbox.DeadLetterConfig{Schema: db.Schema, Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := dl.List(context.Background(), core.ListParams{Limit: 10}); len(got) != 3 {
		t.Fatalf("after refused commands, billing has %d dead letters, want 3", len(got))
	}

	var r actionResult
	okJSON(t, db, &r, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", ids[0])
	if r.Count != 1 || r.Consumer != "billing" || r.Action != "requeue" {
		t.Errorf("requeue = %+v", r)
	}
	if out := ok(t, db, "inbox", "dead", "discard", "--operator", "ops", "--reason", "test", "--consumer", "billing", ids[1], ids[2]); out != "discarded 2 inbox dead letters\n" {
		t.Errorf("discard printed %q", out)
	}
	if got, _ := dl.List(context.Background(), core.ListParams{Limit: 10}); len(got) != 0 {
		t.Errorf("billing still has %d dead letters", len(got))
	}
	fails(t, db, 1, `event `+ids[1]+` is not a dead letter`, "inbox", "dead", "requeue", "--operator", "ops", "--reason", "test", "--consumer", "billing", ids[1])
	// The requeued message is live again: a processor applies it.
	var live int
	if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Schema+`.inbox_event WHERE consumer = 'billing' AND dead_at IS NULL AND NOT processed`).Scan(&live); err != nil || live != 1 {
		t.Errorf("live billing rows = %d, %v; want the requeued one", live, err)
	}
}

func TestConnectionErrors(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"outbox", "stats"}, &stdout, &stderr, func(string) string { return "" })
	if code != 2 || stderr.String() != "millrace: no database: set DATABASE_URL or --database-url\n" {
		t.Errorf("no database: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	code = run(context.Background(), []string{"outbox", "stats", "--schema", "Bad-Name"}, &stdout, &stderr,
		func(string) string { return pgtest.URL() })
	if code != 2 || !strings.Contains(stderr.String(), "--schema") {
		t.Errorf("bad schema: exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	code = run(context.Background(), []string{"outbox", "stats", "--database-url", "postgres://postgres@127.0.0.1:1/test?connect_timeout=2"}, &stdout, &stderr,
		func(string) string { return "" })
	if code != 1 || !strings.Contains(stderr.String(), "does not answer") || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("database down: exit %d, stderr %q", code, stderr.String())
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), nil, &stdout, &stderr, func(string) string { return "" }); code != 0 || !strings.Contains(stdout.String(), "Available Commands:") {
		t.Errorf("plain millrace: exit %d, stdout %q", code, stdout.String())
	}
	stdout.Reset()
	if code := run(context.Background(), []string{"lsit"}, &stdout, &stderr, func(string) string { return "" }); code != 2 || !strings.Contains(stderr.String(), `unknown command "lsit" for "millrace"`) {
		t.Errorf("millrace lsit: exit %d, stderr %q", code, stderr.String())
	}
}

func TestHelpLogging(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"help", "logging"}, &stdout, &stderr, func(string) string { return "" }); code != 0 {
		t.Fatalf("help logging: exit %d, %s", code, stderr.String())
	}
	for _, want := range []string{"watermill.NewSlogLogger", "event_id", "partition_key", "saga_id", "topic"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("help logging lacks %q", want)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	opstest.OutboxDead(t, db, "orders", 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--database-url", pgtest.URL(), "--schema", db.Schema, "console", "--operator", "ops", "--listen", "127.0.0.1:0", "--prefix", "/ops", "--read-only"},
			io.Discard, &stderr, func(string) string { return "" })
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
	if !strings.Contains(stderr.String(), "(read-only)") || !strings.HasSuffix(base, "/ops/") {
		t.Errorf("start line %q", stderr.String())
	}
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `<span class="value" id="dead">1</span>`) || !strings.Contains(string(body), "read-only") {
		t.Errorf("GET %s: %d\n%s", base, resp.StatusCode, body)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("console exit %d after interrupt: %s", code, stderr.String())
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestConsoleCommandSagas: the stock binary's console records saga actions
// as requests; one built with the definitions acts through them.
func TestConsoleCommandSagas(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	s := opstest.NewSagas(t, db)
	s.StuckRefund(t, "refund-1")
	page := func(cfg Config) string {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var stderr syncBuffer
		done := make(chan int, 1)
		go func() {
			done <- Run(ctx, []string{"--database-url", pgtest.URL(), "--schema", db.Schema, "console", "--operator", "ops", "--listen", "127.0.0.1:0"},
				io.Discard, &stderr, func(string) string { return "" }, cfg)
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
		resp, err := http.Get(base + "saga/retry?id=refund-1")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("confirm page: %d\n%s", resp.StatusCode, body)
		}
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("console exit %d after interrupt: %s", code, stderr.String())
		}
		http.DefaultClient.CloseIdleConnections()
		return string(body)
	}
	if body := page(Config{}); !strings.Contains(body, `id="request-note"`) {
		t.Errorf("the stock console does not say it records a request:\n%s", body)
	}
	register := func(o *saga.Orchestrator) error { return o.Register(s.Refund, s.Ship) }
	if body := page(Config{Sagas: register}); strings.Contains(body, `id="request-note"`) {
		t.Errorf("a console built with the definitions records requests:\n%s", body)
	}
}
