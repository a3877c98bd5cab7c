package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/internal/sqlident"
	"github.com/millrace/millrace/outbox"
)

// opsBundle is what the admin and cleaner tests work with: a fresh schema,
// a Writer to put events in, and SQL helpers that move events between the
// states the relay would put them in.
type opsBundle struct {
	t     *testing.T
	db    *pgtest.DB
	w     *outbox.Writer
	admin *outbox.Admin
	ctx   context.Context
}

func opsSetup(t *testing.T) *opsBundle {
	t.Helper()
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, NotifyInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	a, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return &opsBundle{t: t, db: db, w: w, admin: a, ctx: context.Background()}
}

// sql replaces {event} and {pending} with the test schema's tables.
func (b *opsBundle) sql(q string) string {
	return strings.NewReplacer(
		"{event}", sqlident.Table(b.db.Schema, "outbox_event"),
		"{pending}", sqlident.Table(b.db.Schema, "outbox_pending"),
	).Replace(q)
}

func (b *opsBundle) exec(q string, args ...any) {
	b.t.Helper()
	if _, err := b.db.Pool.Exec(b.ctx, b.sql(q), args...); err != nil {
		b.t.Fatalf("%s: %v", q, err)
	}
}

// write writes events and returns their ids.
func (b *opsBundle) write(events ...outbox.Event) []string {
	b.t.Helper()
	ids, err := b.w.Write(b.ctx, events...)
	if err != nil {
		b.t.Fatal(err)
	}
	return ids
}

// opsEvent returns a JSON event on topic with key.
func opsEvent(topic, key string) outbox.Event {
	return outbox.Event{Topic: topic, PartitionKey: key, Payload: []byte(`{"n":1}`)}
}

// rowID returns the log row id of an event.
func (b *opsBundle) rowID(eventID string) int64 {
	b.t.Helper()
	var id int64
	if err := b.db.Pool.QueryRow(b.ctx, b.sql(`SELECT id FROM {event} WHERE event_id = $1`), eventID).Scan(&id); err != nil {
		b.t.Fatal(err)
	}
	return id
}

// publish marks events published at the given time, as the relay does.
func (b *opsBundle) publish(at time.Time, eventIDs ...string) {
	b.t.Helper()
	b.exec(`WITH e AS (UPDATE {event} SET published_at = $2 WHERE event_id = ANY($1::uuid[]) RETURNING id)
DELETE FROM {pending} p USING e WHERE p.id = e.id`, eventIDs, at)
}

// fail records a failed attempt as the relay does; dead makes it a dead letter.
func (b *opsBundle) fail(eventID, reason string, attempts int, dead bool) {
	b.t.Helper()
	b.exec(`WITH e AS (
    UPDATE {event} SET attempts = $2, last_error = $3, next_attempt_at = now() + interval '1 hour',
                       dead_at = CASE WHEN $4 THEN now() END
     WHERE event_id = $1 RETURNING id)
UPDATE {pending} p SET blocked = true, dead = $4, next_attempt_at = now() + interval '1 hour' FROM e WHERE p.id = e.id`,
		eventID, attempts, reason, dead)
}

// created sets created_at of events.
func (b *opsBundle) created(at time.Time, eventIDs ...string) {
	b.t.Helper()
	b.exec(`UPDATE {event} SET created_at = $2 WHERE event_id = ANY($1::uuid[])`, eventIDs, at)
}

// pendingIDs returns the event ids in the pending set, in row order.
func (b *opsBundle) pendingIDs() []string {
	b.t.Helper()
	rows, err := b.db.Pool.Query(b.ctx, b.sql(`SELECT e.event_id::text FROM {pending} p JOIN {event} e ON e.id = p.id ORDER BY p.id`))
	if err != nil {
		b.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.t.Fatal(err)
	}
	return ids
}

type opsPendingRow struct {
	Blocked, Dead bool
	NextAttempt   *time.Time
}

// pendingRow returns the pending row of an event, ok=false if it has none.
func (b *opsBundle) pendingRow(eventID string) (opsPendingRow, bool) {
	b.t.Helper()
	var r opsPendingRow
	err := b.db.Pool.QueryRow(b.ctx, b.sql(`SELECT p.blocked, p.dead, p.next_attempt_at FROM {pending} p JOIN {event} e ON e.id = p.id WHERE e.event_id = $1`), eventID).
		Scan(&r.Blocked, &r.Dead, &r.NextAttempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	if err != nil {
		b.t.Fatal(err)
	}
	return r, true
}

type opsLogRow struct {
	Attempts                                      int
	LastError                                     *string
	NextAttempt, DeadAt, DiscardedAt, PublishedAt *time.Time
}

func (b *opsBundle) logRow(eventID string) opsLogRow {
	b.t.Helper()
	var r opsLogRow
	err := b.db.Pool.QueryRow(b.ctx, b.sql(`SELECT attempts, last_error, next_attempt_at, dead_at, discarded_at, published_at FROM {event} WHERE event_id = $1`), eventID).
		Scan(&r.Attempts, &r.LastError, &r.NextAttempt, &r.DeadAt, &r.DiscardedAt, &r.PublishedAt)
	if err != nil {
		b.t.Fatal(err)
	}
	return r
}

func TestNewAdminValidates(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	if _, err := outbox.NewAdmin(nil, outbox.AdminConfig{}); err == nil {
		t.Error("nil pool accepted")
	}
	if _, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: `x"; DROP TABLE y; --`}); err == nil {
		t.Error("bad schema accepted")
	}
	if _, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{ReplayChunk: -1}); err == nil {
		t.Error("negative ReplayChunk accepted")
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	bin := opsEvent("payments", "k2")
	bin.Payload, bin.Binary = []byte{0, 1, 2, 0xff}, true
	full := outbox.Event{
		Topic: "orders", PartitionKey: "k1", AggregateType: "order", AggregateID: "o-1", EventType: "OrderCreated",
		Payload: []byte(`{"total":42}`), Metadata: map[string]string{"traceparent": "00-abc-def-01"},
	}
	ids := b.write(full, opsEvent("orders", "k1"), bin, opsEvent("orders", "k3"), opsEvent("orders", "k4"), opsEvent("orders", "k5"))
	b.fail(ids[0], "schema registry: unknown subject", 10, true)
	b.fail(ids[2], "message too large", 3, true)
	b.fail(ids[3], "broker said no", 7, true)
	b.fail(ids[4], "still trying", 2, false) // blocked, not dead: not listed
	// ids[1] waits behind ids[0]; ids[5] is pending: neither is listed.

	got, err := b.admin.List(b.ctx, core.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, d := range got {
		gotIDs = append(gotIDs, d.EventID)
	}
	if want := []string{ids[0], ids[2], ids[3]}; !slices.Equal(gotIDs, want) {
		t.Fatalf("dead letters = %v, want %v", gotIDs, want)
	}
	d := got[0]
	if d.ID != b.rowID(ids[0]) || d.Topic != "orders" || d.PartitionKey != "k1" || d.AggregateType != "order" ||
		d.AggregateID != "o-1" || d.EventType != "OrderCreated" || d.Attempts != 10 ||
		d.LastError != "schema registry: unknown subject" || d.Binary || string(d.Payload) != `{"total":42}` ||
		d.Metadata["traceparent"] != "00-abc-def-01" || d.CreatedAt.IsZero() || d.DeadAt.Before(d.CreatedAt) {
		t.Errorf("dead letter 0 = %+v", d)
	}
	if d := got[1]; !d.Binary || !slices.Equal(d.Payload, []byte{0, 1, 2, 0xff}) || d.LastError != "message too large" || d.Attempts != 3 {
		t.Errorf("dead letter 1 = %+v", d)
	}

	// Keyset paging.
	page1, err := b.admin.List(b.ctx, core.ListParams{Limit: 2})
	if err != nil || len(page1) != 2 || page1[1].EventID != ids[2] {
		t.Fatalf("page 1 = %v, %v", page1, err)
	}
	page2, err := b.admin.List(b.ctx, core.ListParams{Limit: 2, AfterID: page1[1].ID})
	if err != nil || len(page2) != 1 || page2[0].EventID != ids[3] {
		t.Fatalf("page 2 = %v, %v", page2, err)
	}
	page3, err := b.admin.List(b.ctx, core.ListParams{Limit: 2, AfterID: page2[0].ID})
	if err != nil || len(page3) != 0 {
		t.Fatalf("page 3 = %v, %v", page3, err)
	}

	// Filters.
	byTopic, err := b.admin.List(b.ctx, core.ListParams{Topic: "payments"})
	if err != nil || len(byTopic) != 1 || byTopic[0].EventID != ids[2] {
		t.Errorf("topic filter = %v, %v", byTopic, err)
	}
	byKey, err := b.admin.List(b.ctx, core.ListParams{PartitionKey: "k3"})
	if err != nil || len(byKey) != 1 || byKey[0].EventID != ids[3] {
		t.Errorf("key filter = %v, %v", byKey, err)
	}
	none, err := b.admin.List(b.ctx, core.ListParams{Topic: "orders", PartitionKey: "k2"})
	if err != nil || len(none) != 0 {
		t.Errorf("topic+key filter = %v, %v", none, err)
	}
	for _, bad := range []core.ListParams{{Limit: -1}, {AfterID: -1}} {
		if _, err := b.admin.List(b.ctx, bad); !errors.Is(err, core.ErrInvalidListParams) {
			t.Errorf("List(%+v) = %v, want ErrInvalidListParams", bad, err)
		}
	}
}

func TestRequeue(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	ids := b.write(opsEvent("t", "a"), opsEvent("t", "b"), opsEvent("t", "c"), opsEvent("t", "d"))
	b.fail(ids[0], "boom", 10, true)
	b.fail(ids[1], "bang", 10, true)
	b.fail(ids[2], "retrying", 3, false)
	// ids[3] is plainly pending.
	unknown := "0190aaaa-0000-7000-8000-000000000000"

	n, err := b.admin.Requeue(b.ctx, opsActor, ids[0], ids[2], ids[3], unknown)
	if err != nil || n != 1 {
		t.Fatalf("Requeue = %d, %v; want 1 (only the dead letter)", n, err)
	}
	// Due at once (next_attempt_at now: handed to a CDC relay's polling
	// half too, which leaves rows with none to the stream).
	if p, ok := b.pendingRow(ids[0]); !ok || p.Dead || p.Blocked || p.NextAttempt == nil || time.Until(*p.NextAttempt) > 0 {
		t.Errorf("pending row after requeue = %+v, %v", p, ok)
	}
	if l := b.logRow(ids[0]); l.DeadAt != nil || l.Attempts != 0 || l.NextAttempt != nil || l.LastError == nil || *l.LastError != "boom" {
		t.Errorf("log row after requeue = %+v", l)
	}
	// The blocked (not dead) event is untouched.
	if p, ok := b.pendingRow(ids[2]); !ok || !p.Blocked || p.NextAttempt == nil {
		t.Errorf("blocked row changed: %+v", p)
	}
	if l := b.logRow(ids[2]); l.Attempts != 3 {
		t.Errorf("blocked log row changed: %+v", l)
	}
	// Again: nothing dead any more.
	if n, err := b.admin.Requeue(b.ctx, opsActor, ids[0]); err != nil || n != 0 {
		t.Errorf("second Requeue = %d, %v; want 0", n, err)
	}

	// A bad id fails the call and changes nothing.
	if _, err := b.admin.Requeue(b.ctx, opsActor, ids[1], "not-a-uuid"); !errors.Is(err, core.ErrInvalidEventID) || !strings.Contains(err.Error(), "not-a-uuid") {
		t.Errorf("Requeue(bad id) = %v, want ErrInvalidEventID naming the id", err)
	}
	if p, _ := b.pendingRow(ids[1]); !p.Dead {
		t.Error("a failed Requeue changed a row")
	}
	if n, err := b.admin.Requeue(b.ctx, opsActor); err != nil || n != 0 {
		t.Errorf("Requeue() = %d, %v", n, err)
	}

	// RequeueTx follows the caller's transaction.
	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // releases the connection if the test stops early
	if n, err := b.admin.RequeueTx(b.ctx, tx, opsActor, ids[1]); err != nil || n != 1 {
		t.Fatalf("RequeueTx = %d, %v", n, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := b.pendingRow(ids[1]); !p.Dead {
		t.Error("a rolled back RequeueTx took effect")
	}
	err = pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		n, err := b.admin.RequeueTx(b.ctx, tx, opsActor, ids[1])
		if err == nil && n != 1 {
			err = fmt.Errorf("RequeueTx = %d", n)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := b.pendingRow(ids[1]); p.Dead || p.Blocked {
		t.Errorf("committed RequeueTx did not take effect: %+v", p)
	}
}

func TestDiscard(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	ids := b.write(opsEvent("t", "a"), opsEvent("t", "a"), opsEvent("t", "b"), opsEvent("t", "c"))
	b.fail(ids[0], "boom", 10, true) // ids[1] waits behind it
	b.fail(ids[2], "retrying", 1, false)
	b.fail(ids[3], "bang", 10, true)

	n, err := b.admin.Discard(b.ctx, opsActor, ids[0], ids[1], ids[2])
	if err != nil || n != 1 {
		t.Fatalf("Discard = %d, %v; want 1 (only the dead letter)", n, err)
	}
	if _, ok := b.pendingRow(ids[0]); ok {
		t.Error("discarded event is still pending")
	}
	if l := b.logRow(ids[0]); l.DiscardedAt == nil || l.DeadAt == nil || l.PublishedAt != nil || *l.LastError != "boom" {
		t.Errorf("log row after discard = %+v", l)
	}
	// The event behind it and the blocked one stay pending, as they were.
	if p, ok := b.pendingRow(ids[1]); !ok || p.Blocked {
		t.Errorf("event behind the dead letter: %+v, %v", p, ok)
	}
	if p, ok := b.pendingRow(ids[2]); !ok || !p.Blocked {
		t.Errorf("blocked event: %+v, %v", p, ok)
	}
	if l := b.logRow(ids[2]); l.DiscardedAt != nil {
		t.Error("a blocked event was marked discarded")
	}
	if dl, err := b.admin.List(b.ctx, core.ListParams{}); err != nil || len(dl) != 1 || dl[0].EventID != ids[3] {
		t.Errorf("dead letters after discard = %v, %v", dl, err)
	}
	if _, err := b.admin.Discard(b.ctx, opsActor, "nope"); !errors.Is(err, core.ErrInvalidEventID) {
		t.Errorf("Discard(bad id) = %v", err)
	}

	tx, err := b.db.Pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // releases the connection if the test stops early
	if n, err := b.admin.DiscardTx(b.ctx, tx, opsActor, ids[3]); err != nil || n != 1 {
		t.Fatalf("DiscardTx = %d, %v", n, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if p, ok := b.pendingRow(ids[3]); !ok || !p.Dead {
		t.Error("a rolled back DiscardTx took effect")
	}
	if l := b.logRow(ids[3]); l.DiscardedAt != nil {
		t.Error("a rolled back DiscardTx marked the log")
	}
}

// A dead letter requeued and discarded at the same time ends up in exactly
// one of the two states.
func TestRequeueDiscardRace(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	events := make([]outbox.Event, 40)
	for i := range events {
		events[i] = opsEvent("t", fmt.Sprint("k", i))
	}
	ids := b.write(events...)
	for _, id := range ids {
		b.fail(id, "boom", 10, true)
	}
	var (
		wg                  sync.WaitGroup
		requeued, discarded int
		rErr, dErr          error
	)
	wg.Add(2)
	go func() { defer wg.Done(); requeued, rErr = b.admin.Requeue(b.ctx, opsActor, ids...) }()
	go func() { defer wg.Done(); discarded, dErr = b.admin.Discard(b.ctx, opsActor, ids...) }()
	wg.Wait()
	if rErr != nil || dErr != nil {
		t.Fatal(rErr, dErr)
	}
	if requeued+discarded != len(ids) {
		t.Fatalf("requeued %d + discarded %d != %d", requeued, discarded, len(ids))
	}
	var nRequeued, nDiscarded int
	for _, id := range ids {
		p, pending := b.pendingRow(id)
		l := b.logRow(id)
		switch {
		case pending && !p.Dead && l.DiscardedAt == nil && l.DeadAt == nil:
			nRequeued++
		case !pending && l.DiscardedAt != nil:
			nDiscarded++
		default:
			t.Errorf("event %s: pending=%v %+v, log %+v", id, pending, p, l)
		}
	}
	if nRequeued != requeued || nDiscarded != discarded {
		t.Errorf("states: %d requeued, %d discarded; calls said %d, %d", nRequeued, nDiscarded, requeued, discarded)
	}
}

// replayFixture is a log of published events with varied fields, plus
// events in every unpublished state, which Replay must never select.
type replayFixture struct {
	*opsBundle
	base      time.Time
	published []replayRow
	never     []string // pending, blocked, dead, discarded
}

type replayRow struct {
	id, eventID                   string
	rowID                         int64
	created                       time.Time
	aggType, aggID, evType, topic string
	key                           string
}

func newReplayFixture(t *testing.T, cfg outbox.AdminConfig) *replayFixture {
	b := opsSetup(t)
	cfg.Schema = b.db.Schema
	a, err := outbox.NewAdmin(b.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.admin = a
	f := &replayFixture{opsBundle: b, base: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var events []outbox.Event
	for i := range 12 {
		events = append(events, outbox.Event{
			Topic:         []string{"orders", "payments"}[i%2],
			PartitionKey:  fmt.Sprint("key-", i%4),
			AggregateType: []string{"order", "payment", "refund"}[i%3],
			AggregateID:   fmt.Sprint("agg-", i%5),
			EventType:     []string{"Created", "Updated"}[i/6],
			Payload:       []byte(`{}`),
		})
	}
	ids := b.write(events...)
	for i, id := range ids {
		created := f.base.Add(time.Duration(i) * time.Hour)
		b.created(created, id)
		b.publish(created.Add(time.Minute), id)
		e := events[i]
		f.published = append(f.published, replayRow{id: id, eventID: id, rowID: b.rowID(id), created: created,
			aggType: e.AggregateType, aggID: e.AggregateID, evType: e.EventType, topic: e.Topic, key: e.PartitionKey})
	}
	// Unpublished events that match every filter below but must never be
	// replayed: plain pending, failing, dead, discarded.
	var un []outbox.Event
	for range 4 {
		un = append(un, outbox.Event{Topic: "orders", PartitionKey: "key-0", AggregateType: "order", AggregateID: "agg-0", EventType: "Created", Payload: []byte(`{}`)})
	}
	f.never = b.write(un...)
	b.created(f.base.Add(time.Hour), f.never...)
	b.fail(f.never[1], "retrying", 1, false)
	b.fail(f.never[2], "boom", 10, true)
	b.fail(f.never[3], "boom", 10, true)
	if n, err := a.Discard(b.ctx, opsActor, f.never[3]); err != nil || n != 1 {
		t.Fatal(n, err)
	}
	return f
}

// replayed returns the published events now pending again, and takes them
// out of the pending set (as a relay would) for the next case.
func (f *replayFixture) replayed() []string {
	f.t.Helper()
	var out []string
	pending := f.pendingIDs()
	for _, r := range f.published {
		if slices.Contains(pending, r.eventID) {
			out = append(out, r.eventID)
		}
	}
	f.exec(`DELETE FROM {pending} p USING {event} e WHERE e.id = p.id AND e.published_at IS NOT NULL`)
	return out
}

func TestReplaySelectsExactlyTheFilter(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t, outbox.AdminConfig{})
	pub := f.published
	cases := []struct {
		name   string
		filter outbox.ReplayFilter
		want   func(r replayRow) bool
	}{
		{"From", outbox.ReplayFilter{From: f.base.Add(9 * time.Hour)}, func(r replayRow) bool { return !r.created.Before(f.base.Add(9 * time.Hour)) }},
		{"To", outbox.ReplayFilter{To: f.base.Add(3 * time.Hour)}, func(r replayRow) bool { return r.created.Before(f.base.Add(3 * time.Hour)) }},
		{"FromTo", outbox.ReplayFilter{From: f.base.Add(2 * time.Hour), To: f.base.Add(5 * time.Hour)}, func(r replayRow) bool {
			return !r.created.Before(f.base.Add(2*time.Hour)) && r.created.Before(f.base.Add(5*time.Hour))
		}},
		{"FromID", outbox.ReplayFilter{FromID: pub[8].rowID}, func(r replayRow) bool { return r.rowID >= pub[8].rowID }},
		{"ToID", outbox.ReplayFilter{ToID: pub[2].rowID}, func(r replayRow) bool { return r.rowID <= pub[2].rowID }},
		{"FromIDToID", outbox.ReplayFilter{FromID: pub[3].rowID, ToID: pub[6].rowID}, func(r replayRow) bool {
			return r.rowID >= pub[3].rowID && r.rowID <= pub[6].rowID
		}},
		{"AggregateType", outbox.ReplayFilter{AggregateType: "payment"}, func(r replayRow) bool { return r.aggType == "payment" }},
		{"AggregateID", outbox.ReplayFilter{AggregateID: "agg-0"}, func(r replayRow) bool { return r.aggID == "agg-0" }},
		{"EventType", outbox.ReplayFilter{EventType: "Updated"}, func(r replayRow) bool { return r.evType == "Updated" }},
		{"Topic", outbox.ReplayFilter{Topic: "payments"}, func(r replayRow) bool { return r.topic == "payments" }},
		{"PartitionKey", outbox.ReplayFilter{PartitionKey: "key-1"}, func(r replayRow) bool { return r.key == "key-1" }},
		{"Combined", outbox.ReplayFilter{Topic: "orders", AggregateType: "order", To: f.base.Add(7 * time.Hour)}, func(r replayRow) bool {
			return r.topic == "orders" && r.aggType == "order" && r.created.Before(f.base.Add(7*time.Hour))
		}},
		{"NoMatch", outbox.ReplayFilter{AggregateID: "agg-none"}, func(replayRow) bool { return false }},
		{"All", outbox.ReplayFilter{All: true}, func(replayRow) bool { return true }},
	}
	for _, c := range cases {
		var want []string
		for _, r := range pub {
			if c.want(r) {
				want = append(want, r.eventID)
			}
		}
		n, err := f.admin.Replay(f.ctx, c.filter, opsActor)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := f.replayed()
		if int(n) != len(want) || !slices.Equal(got, want) {
			t.Errorf("%s: Replay = %d, pending again %v; want %d: %v", c.name, n, got, len(want), want)
		}
		if c.name != "NoMatch" && len(want) == 0 {
			t.Errorf("%s: the fixture selects nothing; the case proves nothing", c.name)
		}
	}
	// Unpublished events keep their states through all of it.
	if p, ok := f.pendingRow(f.never[0]); !ok || p.Blocked {
		t.Errorf("pending event: %+v %v", p, ok)
	}
	if p, ok := f.pendingRow(f.never[1]); !ok || !p.Blocked || p.Dead {
		t.Errorf("blocked event: %+v %v", p, ok)
	}
	if p, ok := f.pendingRow(f.never[2]); !ok || !p.Dead {
		t.Errorf("dead letter: %+v %v", p, ok)
	}
	if _, ok := f.pendingRow(f.never[3]); ok {
		t.Error("a discarded event was replayed")
	}
}

func TestReplayRefusesEmptyAndInvalidFilters(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	ids := b.write(opsEvent("t", "k"))
	b.publish(time.Now(), ids...)
	if _, err := b.admin.Replay(b.ctx, outbox.ReplayFilter{}, opsActor); !errors.Is(err, outbox.ErrInvalidReplayFilter) {
		t.Errorf("empty filter: %v", err)
	}
	now := time.Now()
	for name, f := range map[string]outbox.ReplayFilter{
		"ToBeforeFrom":   {From: now, To: now.Add(-time.Hour)},
		"ToIDBelowFrom":  {FromID: 10, ToID: 5},
		"NegativeFromID": {FromID: -1},
	} {
		if _, err := b.admin.Replay(b.ctx, f, opsActor); !errors.Is(err, outbox.ErrInvalidReplayFilter) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if got := b.pendingIDs(); len(got) != 0 {
		t.Errorf("a refused replay queued %v", got)
	}
}

func TestReplayIsIdempotentWhilePendingAndChunks(t *testing.T) {
	t.Parallel()
	// Chunks of 2 over 12 published events (and 4 unpublished ones among
	// the ids) make Replay loop; a wrong cursor loses or repeats events.
	f := newReplayFixture(t, outbox.AdminConfig{ReplayChunk: 2})
	n, err := f.admin.Replay(f.ctx, outbox.ReplayFilter{All: true}, opsActor)
	if err != nil || n != int64(len(f.published)) {
		t.Fatalf("Replay = %d, %v; want %d", n, err, len(f.published))
	}
	before := f.pendingIDs()
	n, err = f.admin.Replay(f.ctx, outbox.ReplayFilter{All: true}, opsActor)
	if err != nil || n != 0 {
		t.Fatalf("second Replay while pending = %d, %v; want 0", n, err)
	}
	if after := f.pendingIDs(); !slices.Equal(before, after) {
		t.Errorf("second Replay changed the pending set: %v -> %v", before, after)
	}
	if got := f.replayed(); len(got) != len(f.published) {
		t.Errorf("replayed %d events, want %d", len(got), len(f.published))
	}
	// Once the relay has published them again, they can be replayed again.
	n, err = f.admin.Replay(f.ctx, outbox.ReplayFilter{Topic: "orders"}, opsActor)
	if err != nil || n != 6 {
		t.Errorf("Replay after republish = %d, %v; want 6", n, err)
	}
}

func TestReplayTx(t *testing.T) {
	t.Parallel()
	f := newReplayFixture(t, outbox.AdminConfig{ReplayChunk: 5})
	tx, err := f.db.Pool.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx) //nolint:errcheck // releases the connection if the test stops early
	n, err := f.admin.ReplayTx(f.ctx, tx, outbox.ReplayFilter{EventType: "Created"}, opsActor)
	if err != nil || n != 6 {
		t.Fatalf("ReplayTx = %d, %v; want 6", n, err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.replayed(); len(got) != 0 {
		t.Fatalf("a rolled back ReplayTx queued %v", got)
	}
	err = pgx.BeginFunc(f.ctx, f.db.Pool, func(tx pgx.Tx) error {
		_, err := f.admin.ReplayTx(f.ctx, tx, outbox.ReplayFilter{EventType: "Created"}, opsActor)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.replayed(); len(got) != 6 {
		t.Errorf("committed ReplayTx queued %d, want 6", len(got))
	}
}

func TestStats(t *testing.T) {
	t.Parallel()
	b := opsSetup(t)
	s, err := b.admin.Stats(b.ctx)
	if err != nil || s != (outbox.Stats{}) {
		t.Fatalf("empty outbox: %+v, %v", s, err)
	}
	ids := b.write(opsEvent("t", "a"), opsEvent("t", "b"), opsEvent("t", "c"), opsEvent("t", "d"), opsEvent("t", "e"), opsEvent("t", "f"), opsEvent("t", "g"))
	now := time.Now()
	b.created(now.Add(-5*time.Hour), ids[0]) // dead: not counted as pending, nor as the oldest
	b.fail(ids[0], "boom", 10, true)
	b.created(now.Add(-2*time.Hour), ids[1]) // the oldest pending event
	b.fail(ids[2], "boom", 10, true)
	b.fail(ids[3], "retrying", 1, false)
	b.publish(now, ids[4]) // published: gone from the set
	// ids[1], ids[3], ids[5], ids[6] are pending; ids[3] is blocked.
	s, err = b.admin.Stats(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Pending != 4 || s.PendingEstimated || s.Dead != 2 || s.Blocked != 1 {
		t.Errorf("Stats = %+v; want Pending 4, Dead 2, Blocked 1", s)
	}
	if s.OldestPendingAge < 2*time.Hour || s.OldestPendingAge > 2*time.Hour+time.Minute {
		t.Errorf("OldestPendingAge = %v, want about 2h", s.OldestPendingAge)
	}

	// Above the count limit, the planner's estimate (exact right after ANALYZE).
	a, err := outbox.NewAdmin(b.db.Pool, outbox.AdminConfig{Schema: b.db.Schema, StatsCountLimit: 2})
	if err != nil {
		t.Fatal(err)
	}
	b.exec(`ANALYZE {pending}`)
	s, err = a.Stats(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !s.PendingEstimated || s.Pending != 4 || s.Dead != 2 {
		t.Errorf("estimated Stats = %+v; want Pending 4 (estimated), Dead 2", s)
	}
}
