package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/kafka"
	"github.com/millrace/millrace/outbox"
)

// writeThenCommit runs write in a fresh transaction, then writes one good
// event and commits: a write that failed validation must leave the
// transaction usable, so the good event is committed whatever write did.
// It returns write's error and the good event's id.
func writeThenCommit(t *testing.T, db *pgtest.DB, w *outbox.Writer, write func(tx pgx.Tx) error) (error, string) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	werr := write(tx)
	ids, err := w.WriteTx(ctx, tx, outbox.Event{Topic: "good", PartitionKey: "k", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatalf("transaction unusable after %v: %v", werr, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after %v: %v", werr, err)
	}
	if n := countRows(t, db, "outbox_event", "event_id = '"+ids[0]+"'"); n != 1 {
		t.Fatalf("good event not committed after %v", werr)
	}
	return werr, ids[0]
}

// Hostile bytes in any text field are an *EventError before anything is
// sent: the caller's transaction survives and commits.
func TestWriteRefusesNULAndInvalidUTF8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	good := func() outbox.Event {
		return outbox.Event{Topic: "t", PartitionKey: "k", AggregateType: "A", AggregateID: "a-1", EventType: "E", Payload: []byte(`{"ok":true}`)}
	}
	type testCase struct {
		edit func(*outbox.Event)
		want error
	}
	cases := map[string]testCase{}
	for name, c := range map[string]testCase{
		"NUL in topic":             {func(e *outbox.Event) { e.Topic = "or\x00ders" }, invalidEvent("NUL or invalid UTF-8")},
		"bad UTF-8 in topic":       {func(e *outbox.Event) { e.Topic = "or\xffders" }, invalidEvent("NUL or invalid UTF-8")},
		"NUL in key":               {func(e *outbox.Event) { e.PartitionKey = "k\x00" }, invalidEvent("NUL or invalid UTF-8")},
		"bad UTF-8 in key":         {func(e *outbox.Event) { e.PartitionKey = "\xc3\x28" }, invalidEvent("NUL or invalid UTF-8")},
		"NUL in event type":        {func(e *outbox.Event) { e.EventType = "E\x00" }, invalidEvent("NUL or invalid UTF-8")},
		"bad UTF-8 in event type":  {func(e *outbox.Event) { e.EventType = "\xed\xa0\x80" }, invalidEvent("NUL or invalid UTF-8")},
		"NUL in aggregate type":    {func(e *outbox.Event) { e.AggregateType = "\x00" }, invalidEvent("NUL or invalid UTF-8")},
		"bad UTF-8 in aggregate":   {func(e *outbox.Event) { e.AggregateID = "a\xfe" }, invalidEvent("NUL or invalid UTF-8")},
		"NUL in metadata value":    {func(e *outbox.Event) { e.Metadata = map[string]string{"trace": "a\x00b"} }, invalidEvent("metadata")},
		"NUL in metadata key":      {func(e *outbox.Event) { e.Metadata = map[string]string{"tr\x00ace": "ab"} }, invalidEvent("metadata")},
		"bad UTF-8 metadata value": {func(e *outbox.Event) { e.Metadata = map[string]string{"trace": "\xff"} }, invalidEvent("metadata")},
		"bad UTF-8 metadata key":   {func(e *outbox.Event) { e.Metadata = map[string]string{"\xff": "x"} }, invalidEvent("metadata")},
		"empty metadata key":       {func(e *outbox.Event) { e.Metadata = map[string]string{"": "x"} }, invalidEvent("metadata")},
		"metadata key disagrees":   {func(e *outbox.Event) { e.Metadata = map[string]string{core.MetadataPartitionKey: "other"} }, invalidEvent("metadata")},
		"content type disagrees": {func(e *outbox.Event) {
			e.Metadata = map[string]string{core.MetadataContentType: core.ContentTypeBinary}
		}, invalidEvent("metadata")},
		"JSON in bad UTF-8": {func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\xff\"}") }, invalidEvent("not valid JSON")},
		"raw NUL in JSON":   {func(e *outbox.Event) { e.Payload = []byte("{\"a\":\"\x00\"}") }, invalidEvent("not valid JSON")},
		"topic too long":    {func(e *outbox.Event) { e.Topic = strings.Repeat("t", outbox.MaxKeyBytes+1) }, invalidEvent("too long")},
		"key too long":      {func(e *outbox.Event) { e.PartitionKey = strings.Repeat("k", outbox.MaxKeyBytes+1) }, invalidEvent("too long")},
	} {
		cases[name] = c
	}
	t.Run("fields", func(t *testing.T) {
		for name, c := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bad := good()
				c.edit(&bad)
				for _, events := range [][]outbox.Event{{bad}, {good(), bad}} { // the one-row and the many-row statement
					werr, _ := writeThenCommit(t, db, w, func(tx pgx.Tx) error {
						_, err := w.WriteTx(ctx, tx, events...)
						return err
					})
					var ee *outbox.EventError
					if !wraps(werr, c.want) || !errors.As(werr, &ee) || ee.Index != len(events)-1 {
						t.Fatalf("%d events: err = %v, want an *EventError wrapping %v at index %d", len(events), werr, c.want, len(events)-1)
					}
					var pgErr *pgconn.PgError
					if errors.As(werr, &pgErr) {
						t.Fatalf("validation reached the database: %v", werr)
					}
				}
			})
		}
	})
	// Through the Watermill publisher too.
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set("baggage", "x\x00y")
	werr, _ := writeThenCommit(t, db, w, func(tx pgx.Tx) error { return w.TxPublisher(tx).Publish("t", msg) })
	if !wraps(werr, invalidEvent("metadata")) {
		t.Fatalf("publisher: err = %v, want ErrInvalidEvent for its metadata", werr)
	}
	if n := countRows(t, db, "outbox_event", "topic <> 'good'"); n != 0 {
		t.Fatalf("%d refused events were written", n)
	}
}

func TestWriteTxNilTransaction(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w := newWriter(t, db)
	if _, err := w.WriteTx(context.Background(), nil, outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("WriteTx(nil tx) = %v, want ErrNoTx", err)
	}
	if err := w.TxPublisher(nil).Publish("t", message.NewMessage(watermill.NewUUID(), []byte(`{}`))); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("TxPublisher(nil).Publish = %v, want ErrNoTx", err)
	}
	nopool, err := outbox.NewWriter(nil, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nopool.Write(context.Background(), outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}); !errors.Is(err, core.ErrConfig) {
		t.Fatalf("Write without a pool = %v, want an error wrapping core.ErrConfig", err)
	}
}

// The payload reaches the publisher byte for byte as written (jsonb would
// reorder keys, drop duplicates, respell numbers and refuse \u0000), and
// the metadata as given; so does a replay and a dead letter's copy.
func TestPayloadAndMetadataTravelByteForByte(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	payloads := []string{
		`{"b":1,"a":2,"a":3,"n":1.50e2}`,
		"{ \"s\" : \"nul \\u0000 here\",\n\t\"e\": \"\\u00e9\\ud83d\\ude00\", \"z\": -0.0 }",
		`[1, 2.000, "x"]`,
		`"just a string"`,
	}
	md := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "html": `<a href="x">&amp;</a>`, "unicode": "žluťoučký 🐎", "empty": ""}
	var events []outbox.Event
	for _, p := range payloads {
		events = append(events, outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(p), Metadata: md})
	}
	one, err := w.Write(ctx, events[0]) // the one-row statement
	if err != nil {
		t.Fatal(err)
	}
	many, err := w.Write(ctx, events[1:]...) // the many-row statement
	if err != nil {
		t.Fatal(err)
	}
	ids := append(one, many...)
	want := map[string]string{}
	for i, id := range ids {
		want[id] = payloads[i]
	}
	rec := &recorder{}
	stop := startRelay(t, db, outbox.RelayConfig{Publisher: rec, PollInterval: 10 * time.Millisecond})
	eventually(t, 20*time.Second, "events published", func() bool { return len(rec.ids()) == len(ids) })
	check := func(when string, msgs []*message.Message) {
		t.Helper()
		for _, m := range msgs {
			if string(m.Payload) != want[m.UUID] {
				t.Fatalf("%s: payload %q arrived as %q", when, want[m.UUID], m.Payload)
			}
			for k, v := range md {
				if got, ok := m.Metadata[k]; !ok || got != v {
					t.Fatalf("%s: metadata %q = %q arrived as %q", when, k, v, got)
				}
			}
			if m.Metadata.Get(core.MetadataContentType) != core.ContentTypeJSON {
				t.Fatalf("%s: content type %q", when, m.Metadata.Get(core.MetadataContentType))
			}
		}
	}
	check("publish", rec.snapshot())
	// Only events marked published are replayed: wait for the last marks.
	eventually(t, 20*time.Second, "events marked published", func() bool { return countRows(t, db, "outbox_pending", "") == 0 })
	stop()

	// A replay reads the same columns again.
	admin, err := outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Replay(ctx, outbox.ReplayFilter{All: true}, opsActor); err != nil || n != int64(len(ids)) {
		t.Fatalf("Replay = %d, %v", n, err)
	}
	rec2 := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec2, PollInterval: 10 * time.Millisecond})
	eventually(t, 20*time.Second, "replayed events published", func() bool { return len(rec2.ids()) == len(ids) })
	check("replay", rec2.snapshot())

	// Ad hoc queries on the payload still work.
	var b string
	if err := db.Pool.QueryRow(ctx, `SELECT payload->>'b' FROM "`+db.Schema+`".outbox_event WHERE event_id = $1`, ids[0]).Scan(&b); err != nil || b != "1" {
		t.Fatalf("payload->>'b' = %q, %v", b, err)
	}
}

// A message copied to two topics (msg.Copy keeps the UUID) is two events,
// one per topic, in the caller's transaction; the same id twice on one
// topic is refused with ErrDuplicateEvent, before anything is sent when
// both are in one call.
func TestSameMessageToTwoTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`))
	msg.Metadata.Set(core.MetadataPartitionKey, "k")
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		p := w.TxPublisher(tx)
		if err := p.Publish("orders", msg); err != nil {
			return err
		}
		return p.Publish("audit", msg.Copy())
	}); err != nil {
		t.Fatalf("same message to two topics: %v", err)
	}
	if n := countRows(t, db, "outbox_event", "event_id = '"+msg.UUID+"'"); n != 2 {
		t.Fatalf("%d events with the message's id, want 2", n)
	}

	// Twice on one topic in one call: refused before anything is sent.
	twice := outbox.Event{ID: watermill.NewUUID(), Topic: "orders", PartitionKey: "k", Payload: []byte(`{}`)}
	werr, _ := writeThenCommit(t, db, w, func(tx pgx.Tx) error {
		_, err := w.WriteTx(ctx, tx, twice, twice)
		return err
	})
	var ee *outbox.EventError
	if !errors.Is(werr, outbox.ErrDuplicateEvent) || !errors.As(werr, &ee) || ee.Index != 1 || ee.ID != twice.ID {
		t.Fatalf("same id twice in one call: %v, want an *EventError wrapping ErrDuplicateEvent at index 1", werr)
	}
	// In a later call: the database refuses it, and the error says so.
	if _, err := w.Write(ctx, twice); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, twice); !errors.Is(err, outbox.ErrDuplicateEvent) {
		t.Fatalf("id written before on the topic: %v, want ErrDuplicateEvent", err)
	}
	// Both copies reach the relay's publisher, each on its topic.
	rec := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, PollInterval: 10 * time.Millisecond})
	eventually(t, 20*time.Second, "both copies published", func() bool { return rec.ids()[msg.UUID] == 2 })
	topics := map[string]bool{}
	for _, m := range rec.snapshot() {
		if m.UUID == msg.UUID {
			topics[m.Metadata.Get("topic")] = true
		}
	}
	if !topics["orders"] || !topics["audit"] {
		t.Fatalf("copies published on %v, want orders and audit", topics)
	}
}

// With WriterConfig.ValidateTopic set to kafka.ValidateTopic, topic names
// Kafka refuses are refused when written.
func TestWriteValidatesKafkaTopics(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema, ValidateTopic: kafka.ValidateTopic})
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{".", "..", "with space", "slash/ed", "colon:v1", "ünïcode", strings.Repeat("a", 250)} {
		werr, _ := writeThenCommit(t, db, w, func(tx pgx.Tx) error {
			_, err := w.WriteTx(context.Background(), tx, outbox.Event{Topic: topic, PartitionKey: "k", Payload: []byte(`{}`)})
			return err
		})
		var ee *outbox.EventError
		if !errors.Is(werr, outbox.ErrInvalidEvent) || !errors.Is(werr, kafka.ErrInvalidTopic) || !errors.As(werr, &ee) {
			t.Errorf("topic %q: err = %v, want an *EventError wrapping ErrInvalidEvent and kafka.ErrInvalidTopic", topic, werr)
		}
	}
	for _, topic := range []string{"orders", "orders.v1", "Orders_2-x", strings.Repeat("a", 249)} {
		if _, err := w.Write(context.Background(), outbox.Event{Topic: topic, PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
			t.Errorf("topic %q refused: %v", topic, err)
		}
	}
	// Without the option, only what every transport needs is checked.
	plain := newWriter(t, db)
	if _, err := plain.Write(context.Background(), outbox.Event{Topic: "slash/ed", PartitionKey: "k", Payload: []byte(`{}`)}); err != nil {
		t.Fatalf("default writer refused a topic other transports accept: %v", err)
	}
}

// Plain Watermill messages are accepted: no key metadata (keyed by the
// UUID), a payload that is not JSON (stored as bytes), a content type of
// the sender's own, a CQRS message with metadata "name" only; each arrives
// with its payload and metadata unchanged.
func TestPublisherAcceptsPlainWatermillMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	plainJSON := message.NewMessage(watermill.NewUUID(), []byte(`{"b":1,"a":2}`))
	plainText := message.NewMessage(watermill.NewUUID(), []byte("hello, not JSON \xff\x00"))
	plainText.Metadata.Set("foo", "bar")
	typed := message.NewMessage(watermill.NewUUID(), []byte(`plain text`))
	typed.Metadata.Set(core.MetadataContentType, "text/plain")
	cqrsMsg, err := cqrs.JSONMarshaler{}.Marshal(&struct{ Name string }{Name: "Ada"})
	if err != nil {
		t.Fatal(err)
	}
	sent := []*message.Message{plainJSON, plainText, typed, cqrsMsg}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return w.TxPublisher(tx).Publish("plain", sent...)
	}); err != nil {
		t.Fatalf("plain Watermill messages refused: %v", err)
	}
	rec := &recorder{}
	startRelay(t, db, outbox.RelayConfig{Publisher: rec, PollInterval: 10 * time.Millisecond})
	eventually(t, 20*time.Second, "messages published", func() bool { return len(rec.ids()) == len(sent) })
	got := map[string]*message.Message{}
	for _, m := range rec.snapshot() {
		got[m.UUID] = m
	}
	for _, s := range sent {
		m := got[s.UUID]
		if string(m.Payload) != string(s.Payload) {
			t.Fatalf("payload %q arrived as %q", s.Payload, m.Payload)
		}
		for k, v := range s.Metadata {
			if m.Metadata.Get(k) != v {
				t.Fatalf("metadata %q = %q arrived as %q", k, v, m.Metadata.Get(k))
			}
		}
		if key := m.Metadata.Get(core.MetadataPartitionKey); key != s.UUID {
			t.Fatalf("message without a key published with key %q, want its UUID", key)
		}
	}
	if ct := got[plainText.UUID].Metadata.Get(core.MetadataContentType); ct != core.ContentTypeBinary {
		t.Fatalf("non-JSON payload arrived with content type %q", ct)
	}
	if ct := got[typed.UUID].Metadata.Get(core.MetadataContentType); ct != "text/plain" {
		t.Fatalf("the sender's content type arrived as %q", ct)
	}
	if et := got[cqrsMsg.UUID].Metadata.Get(core.MetadataEventType); et == "" {
		t.Fatal("CQRS message arrived without an event type")
	}
	// A message that says it is JSON must be.
	lying := message.NewMessage(watermill.NewUUID(), []byte(`not json`))
	lying.Metadata.Set(core.MetadataContentType, core.ContentTypeJSON)
	werr, _ := writeThenCommit(t, db, w, func(tx pgx.Tx) error { return w.TxPublisher(tx).Publish("plain", lying) })
	if !wraps(werr, invalidEvent("not valid JSON")) {
		t.Fatalf("content_type application/json with a non-JSON payload: %v, want ErrInvalidEvent for its payload", werr)
	}
}

// Both publishers write with the message's context, and both refuse an
// empty Publish with an error wrapping ErrInvalidEvent, as WriteTx does.
func TestPublishersAgreeOnContextAndEmptyCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	cancelled, cancel := context.WithCancel(core.ContextWithTx(ctx, tx))
	cancel()
	for name, p := range map[string]*outbox.Publisher{"TxPublisher": w.TxPublisher(tx), "ContextPublisher": w.ContextPublisher()} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msg.SetContext(cancelled)
		if err := p.Publish("t", msg); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: Publish with a cancelled message context = %v, want context.Canceled", name, err)
		}
		if err := p.Publish("t"); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: Publish() = %v, want ErrInvalidEvent", name, err)
		}
	}
	if _, err := w.WriteTx(ctx, tx); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Errorf("WriteTx() = %v, want ErrInvalidEvent", err)
	}
}

// Every outbox constructor wraps core.ErrConfig and names the field.
func TestConfigErrorsWrapErrConfig(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{NoMigrate: true, MaxConns: 1})
	rec := &recorder{}
	check := func(what, field string, err error) {
		t.Helper()
		if !errors.Is(err, core.ErrConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: err = %v, want one wrapping core.ErrConfig and naming %s", what, err, field)
		}
	}
	_, err := outbox.NewWriter(nil, outbox.WriterConfig{Schema: "Bad-Schema"})
	check("NewWriter", "Schema", err)
	for field, cfg := range map[string]outbox.RelayConfig{
		"Publisher":     {},
		"Schema":        {Publisher: rec, Schema: "Bad-Schema"},
		"BatchSize":     {Publisher: rec, BatchSize: 10_001},
		"Workers":       {Publisher: rec, Workers: -1},
		"RetryMax":      {Publisher: rec, RetryMin: time.Minute, RetryMax: time.Second},
		"MaxAttempts":   {Publisher: rec, MaxAttempts: -1},
		"LanesPerBatch": {Publisher: rec, LanesPerBatch: outbox.Lanes + 1},
	} {
		_, err := outbox.NewRelay(db.Pool, cfg)
		check("NewRelay", field, err)
	}
	_, err = outbox.NewRelay(nil, outbox.RelayConfig{Publisher: rec})
	check("NewRelay(nil)", "pool", err)
	_, err = outbox.NewAdmin(db.Pool, outbox.AdminConfig{ReplayChunk: -1})
	check("NewAdmin", "ReplayChunk", err)
	_, err = outbox.NewAdmin(db.Pool, outbox.AdminConfig{Schema: "Bad-Schema"})
	check("NewAdmin", "Schema", err)
	if _, err := outbox.NewRelay(db.Pool, outbox.RelayConfig{Publisher: rec, BatchSize: 10_000}); err != nil {
		t.Errorf("BatchSize = 10,000 refused: %v", err)
	}
}

// An event inserted by another tool with a lane outside 0..127 is refused
// by the database (it would never be claimed).
func TestLaneOutOfRangeRefusedByDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	q := `INSERT INTO "` + db.Schema + `".outbox_event (event_id, topic, partition_key, lane, payload) VALUES ($1, 't', 'k', $2, '{}')`
	for _, lane := range []int{128, -1, 1000} {
		_, err := db.Pool.Exec(ctx, q, watermill.NewUUID(), lane)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23514" || pgErr.ConstraintName != "outbox_event_lane_range" {
			t.Errorf("lane %d: err = %v, want a check violation of outbox_event_lane_range", lane, err)
		}
	}
	_, err := db.Pool.Exec(ctx, `INSERT INTO "`+db.Schema+`".outbox_pending (id, lane, partition_key) VALUES (1, 128, 'k')`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
		t.Errorf("pending lane 128: err = %v, want a check violation", err)
	}
	if _, err := db.Pool.Exec(ctx, q, watermill.NewUUID(), outbox.Lane("k")); err != nil {
		t.Fatalf("lane in range refused: %v", err)
	}
}

// invalidEvent is, for wraps, an error wrapping outbox.ErrInvalidEvent
// whose message says why: the reason given.
type invalidEvent string

func (r invalidEvent) Error() string { return "invalid event: " + string(r) }

// wraps reports whether err wraps want; for an invalidEvent, whether it
// wraps outbox.ErrInvalidEvent with that reason in its message.
func wraps(err, want error) bool {
	if r, ok := want.(invalidEvent); ok {
		return errors.Is(err, outbox.ErrInvalidEvent) && strings.Contains(err.Error(), string(r))
	}
	return errors.Is(err, want)
}
