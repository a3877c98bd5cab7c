package console_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millrace/millrace/console"
	"github.com/millrace/millrace/internal/kafkatest"
	"github.com/millrace/millrace/internal/opstest"
	"github.com/millrace/millrace/internal/poisontopic"
	"github.com/millrace/millrace/kafka"
)

var bulkCountRE = regexp.MustCompile(`<span id="bulk-count">(\d+)</span>`)

// bulkCount is the count "requeue or discard all N matching" shows, or
// -1 when the page offers none.
func bulkCount(body string) string {
	if m := bulkCountRE.FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return "-1"
}

// Outbox dead letters in bulk through the console: the filter counts the
// matching ones and offers "requeue or discard all N matching"; the
// confirm page shows the count and changes nothing; its POST (with the
// CSRF token) acts on exactly those, is logged with the operator and the
// reason, and the flash says how many.
func TestOutboxDeadBulkConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	orders := opstest.OutboxDead(t, b.db, "orders", 3)
	opstest.OutboxDead(t, b.db, "billing", 2)
	refusal := "%" + opstest.Refusal + "%"

	r := b.get("/outbox/dead")
	if bulkCount(r.body) != "-1" {
		t.Errorf("unfiltered list offers a bulk action:\n%s", r.body)
	}
	r = b.get("/outbox/dead?topic=orders&error=" + url.QueryEscape(refusal))
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "3" {
		t.Fatalf("filtered list: %d, count %s\n%s", r.status, n, r.body)
	}
	contains(t, "filtered list", r.body, orders[0], `/outbox/dead/bulk/discard?error=`)
	if r := b.get("/outbox/dead?error=%25no+such%25"); bulkCount(r.body) != "-1" || !strings.Contains(r.body, "No dead letters match the filter") {
		t.Errorf("a filter matching nothing:\n%s", r.body)
	}

	page := "/outbox/dead/bulk/requeue?topic=orders&error=" + url.QueryEscape(refusal)
	r = b.get(page)
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "3" {
		t.Fatalf("confirm page: %d, count %s\n%s", r.status, n, r.body)
	}
	contains(t, "confirm page", r.body, "Requeue all", "outbox dead letters", "topic orders, last error like "+refusal, orders[0],
		`name="topic" value="orders"`)
	if s := b.stats(); s.Dead != 5 {
		t.Fatalf("the list and confirm pages changed the dead letters: %+v", s)
	}
	form := url.Values{"topic": {"orders"}, "error": {refusal}, "reason": {"broker limit raised"}}
	if r := b.post("/outbox/dead/bulk/requeue", form); r.status != http.StatusForbidden {
		t.Fatalf("POST without a token: %d", r.status)
	}
	if s := b.stats(); s.Dead != 5 {
		t.Fatalf("a POST without a token acted: %+v", s)
	}
	form.Set("csrf_token", b.confirm(page))
	r = b.post("/outbox/dead/bulk/requeue", form)
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST: %d\n%s", r.status, r.body)
	}
	r = b.get(r.location[len(b.prefix):])
	contains(t, "after the requeue", r.body, "Requeued 3 outbox dead letters.")
	if s := b.stats(); s.Dead != 2 {
		t.Errorf("after the bulk requeue: %+v; want billing's 2 still dead", s)
	}
	contains(t, "the log", b.logs.String(), "console: outbox dead letters requeued in bulk", "operator=alice",
		`reason="broker limit raised"`, "count=3", `filter="topic orders, last error like `+refusal+`"`)

	form = url.Values{"older": {"0s"}, "csrf_token": {b.confirm("/outbox/dead/bulk/discard?older=0s")}, "reason": {"obsolete"}}
	if r := b.post("/outbox/dead/bulk/discard", form); r.status != http.StatusSeeOther || !strings.Contains(r.location, "n=2") {
		t.Fatalf("discard all: %d %s", r.status, r.location)
	}
	if s := b.stats(); s.Dead != 0 {
		t.Errorf("after the bulk discard: %+v", s)
	}

	for path, want := range map[string]int{
		"/outbox/dead/bulk/requeue":            http.StatusBadRequest, // no filter
		"/outbox/dead/bulk/requeue?older=soon": http.StatusBadRequest,
		"/outbox/dead/bulk/replay?topic=x":     http.StatusNotFound,
	} {
		if r := b.get(path); r.status != want {
			t.Errorf("GET %s: %d, want %d", path, r.status, want)
		}
	}
	ro := setupOn(t, b.db, console.Config{ReadOnly: true})
	opstest.OutboxDead(t, b.db, "orders", 1)
	if r := ro.get("/outbox/dead?topic=orders"); bulkCount(r.body) != "-1" || strings.Contains(r.body, "/bulk/") {
		t.Errorf("a read-only console offers a bulk action:\n%s", r.body)
	}
	if r := ro.get("/outbox/dead/bulk/requeue?topic=orders"); r.status != http.StatusForbidden {
		t.Errorf("read-only confirm page: %d", r.status)
	}
}

// Inbox dead letters in bulk through the console: only the consumer's
// dead letters the filter selects are acted on.
func TestInboxDeadBulkConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	ids := opstest.InboxDead(t, b.db, "billing", 3)
	other := opstest.InboxDead(t, b.db, "shipping", 1)
	if _, err := b.db.Pool.Exec(context.Background(), `UPDATE `+b.db.Schema+`.inbox_event SET last_error = 'handler: timeout' WHERE event_id = $1`, ids[1]); err != nil {
		t.Fatal(err)
	}
	r := b.get("/inbox/dead?consumer=billing&error=%25not+found%25")
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "2" {
		t.Fatalf("filtered list: %d, count %s\n%s", r.status, n, r.body)
	}
	if strings.Contains(r.body, ids[1]) {
		t.Errorf("the filtered list shows %s, which the filter leaves out", ids[1])
	}
	page := "/inbox/dead/bulk/discard?consumer=billing&error=%25not+found%25"
	r = b.get(page)
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "2" {
		t.Fatalf("confirm page: %d, count %s\n%s", r.status, n, r.body)
	}
	contains(t, "confirm page", r.body, "Discard all", "of consumer", `name="consumer" value="billing"`, ids[0], ids[2])
	form := url.Values{"consumer": {"billing"}, "error": {"%not found%"}, "csrf_token": {b.confirm(page)}, "reason": {"the order is gone"}}
	r = b.post("/inbox/dead/bulk/discard", form)
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST: %d\n%s", r.status, r.body)
	}
	r = b.get(r.location[len(b.prefix):])
	contains(t, "after the discard", r.body, "Discarded 2 inbox dead letters.")
	if got := b.inboxDead("billing"); len(got) != 1 || got[0].EventID != ids[1] {
		t.Errorf("billing's dead letters after the discard: %+v; want only %s", got, ids[1])
	}
	if got := b.inboxDead("shipping"); len(got) != 1 || got[0].EventID != other[0] {
		t.Errorf("shipping's dead letters changed: %+v", got)
	}
	contains(t, "the log", b.logs.String(), "console: inbox dead letters discarded in bulk", "operator=alice", "consumer=billing", "count=2")
	if r := b.get("/inbox/dead/bulk/requeue?error=%25"); r.status != http.StatusBadRequest {
		t.Errorf("confirm page without a consumer: %d", r.status)
	}
}

// A poison topic in bulk through the console: the filter (reason, the
// original topic) counts the matching messages, the confirm page shows the
// count, and its POST sends exactly those back.
func TestPoisonBulkConsole(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.Brokers(t)
	poisonTopic, from, other := kafkatest.Topic(), kafkatest.Topic(), kafkatest.Topic()
	for _, tp := range []string{poisonTopic, from, other} {
		kafkatest.CreateTopic(t, brokers, tp, 1, nil)
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: brokers}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var msgs []*message.Message
	for i, c := range []struct{ reason, origin string }{
		{`compensation: unknown command: "book_flight"`, from}, {"bad payload", from}, {`compensation: unknown command: "refund"`, other},
	} {
		m := message.NewMessage("0190c3f4-0000-7000-8000-00000000002"+string(rune('1'+i)), []byte(`{"n":1}`))
		m.Metadata.Set(middleware.ReasonForPoisonedKey, c.reason)
		m.Metadata.Set(middleware.PoisonedTopicKey, c.origin)
		msgs = append(msgs, m)
	}
	if err := pub.Publish(poisonTopic, msgs...); err != nil {
		t.Fatal(err)
	}
	b := setup(t, console.Config{KafkaBrokers: brokers})
	filter := "topic=" + url.QueryEscape(poisonTopic) + "&error=" + url.QueryEscape("%unknown command%") + "&from=" + url.QueryEscape(from)
	r := b.get("/poison?" + filter)
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "1" {
		t.Fatalf("filtered poison page: %d, count %s\n%s", r.status, n, r.body)
	}
	contains(t, "filtered poison page", r.body, `<span id="poison-matching">1</span>`, msgs[0].UUID, "no discard")
	if strings.Contains(r.body, msgs[1].UUID) || strings.Contains(r.body, `id="requeue-all"`) {
		t.Errorf("the filtered page shows what the filter leaves out, or requeues all:\n%s", r.body)
	}
	page := "/poison/bulk?" + filter
	r = b.get(page)
	if n := bulkCount(r.body); r.status != http.StatusOK || n != "1" {
		t.Fatalf("confirm page: %d, count %s\n%s", r.status, n, r.body)
	}
	contains(t, "confirm page", r.body, "Requeue all", "poisoned messages", "on "+poisonTopic, "Kafka cannot delete one message", msgs[0].UUID)
	if n := kafkatest.RecordCount(t, brokers, from) + kafkatest.RecordCount(t, brokers, other); n != 0 {
		t.Fatalf("the pages sent %d messages", n)
	}
	form := url.Values{"topic": {poisonTopic}, "error": {"%unknown command%"}, "from": {from}, "reason": {"flight participant deployed"},
		"csrf_token": {b.confirm(page)}}
	r = b.post("/poison/bulk", form)
	if r.status != http.StatusSeeOther {
		t.Fatalf("POST: %d\n%s", r.status, r.body)
	}
	r = b.get(r.location[len(b.prefix):])
	contains(t, "after the requeue", r.body, "Requeued 1 poisoned message.")
	if n, got, err := poisontopic.Read(context.Background(), brokers, from, 0); err != nil || n != 1 || got[0].UUID != msgs[0].UUID {
		t.Errorf("on %s after the requeue: %d %+v %v; want only %s", from, n, got, err, msgs[0].UUID)
	}
	if n := kafkatest.RecordCount(t, brokers, other); n != 0 {
		t.Errorf("%d messages sent to %s, which the filter left out", n, other)
	}
	contains(t, "the log", b.logs.String(), "console: poisoned messages requeued in bulk", "operator=alice",
		`reason="flight participant deployed"`, "count=1", "refused=0")
	if r := b.post("/poison/bulk", url.Values{"topic": {poisonTopic}, "csrf_token": {b.confirm(page)}}); r.status != http.StatusBadRequest {
		t.Errorf("POST without a filter: %d", r.status)
	}
}
