package outbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

func newWriter(t testing.TB, db *pgtest.DB) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter(db.Pool, outbox.WriterConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func countRows(t *testing.T, db *pgtest.DB, table, where string) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM "` + db.Schema + `".` + table
	if where != "" {
		q += " WHERE " + where
	}
	if err := db.Pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWriteCommitsWithTheBusinessChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE "`+db.Schema+`".orders (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	write := func(id int, commit bool) {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := tx.Exec(ctx, `INSERT INTO "`+db.Schema+`".orders VALUES ($1)`, id); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteTx(ctx, tx, outbox.Event{Topic: "orders", PartitionKey: "o1", EventType: "OrderCreated", Payload: []byte(`{"id":1}`)}); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(1, false) // rolled back
	if n := countRows(t, db, "outbox_event", ""); n != 0 {
		t.Fatalf("after rollback: %d events, want 0", n)
	}
	if n := countRows(t, db, "outbox_pending", ""); n != 0 {
		t.Fatalf("after rollback: %d pending, want 0", n)
	}
	write(2, true)
	if n := countRows(t, db, "outbox_event", ""); n != 1 {
		t.Fatalf("after commit: %d events, want 1", n)
	}
	if n := countRows(t, db, "outbox_pending", ""); n != 1 {
		t.Fatalf("after commit: %d pending, want 1", n)
	}
}

func TestWriteManyInOneCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	events := make([]outbox.Event, 500)
	for i := range events {
		events[i] = outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}
	}
	events[3] = outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte{0, 1, 2, 0xff}, Binary: true, Metadata: map[string]string{"traceparent": "00-abc-def-01"}}
	ids, err := w.Write(ctx, events...)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 500 {
		t.Fatalf("got %d ids", len(ids))
	}
	if events[0].ID != "" {
		t.Fatal("Write changed the caller's events")
	}
	var raw []byte
	var trace string
	if err := db.Pool.QueryRow(ctx, `SELECT payload_bytes, headers->>'traceparent' FROM "`+db.Schema+`".outbox_event WHERE event_id = $1`, ids[3]).Scan(&raw, &trace); err != nil {
		t.Fatal(err)
	}
	if string(raw) != string([]byte{0, 1, 2, 0xff}) || trace != "00-abc-def-01" {
		t.Fatalf("binary payload %v / header %q not stored as given", raw, trace)
	}
}

func TestWriteRefusesBadEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)
	good := outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}
	for name, c := range map[string]struct {
		e    outbox.Event
		want error
	}{
		"no topic":    {outbox.Event{PartitionKey: "k", Payload: []byte(`{}`)}, invalidEvent("no topic")},
		"empty key":   {outbox.Event{Topic: "t", Payload: []byte(`{}`)}, invalidEvent("empty partition key")},
		"bad id":      {outbox.Event{ID: "not-a-uuid", Topic: "t", PartitionKey: "k", Payload: []byte(`{}`)}, core.ErrInvalidEventID},
		"bad json":    {outbox.Event{Topic: "t", PartitionKey: "k", Payload: []byte(`{"a":`)}, invalidEvent("not valid JSON")},
		"nil payload": {outbox.Event{Topic: "t", PartitionKey: "k"}, invalidEvent("not valid JSON")},
	} {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.WriteTx(ctx, tx, good, c.e)
		var ee *outbox.EventError
		if !wraps(err, c.want) || !errors.As(err, &ee) || ee.Index != 1 {
			t.Errorf("%s: err = %v, want %v at index 1", name, err, c.want)
		}
		// The caller's transaction is still usable: nothing was sent.
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("%s: transaction unusable after a validation error: %v", name, err)
		}
		tx.Rollback(ctx) //nolint:errcheck
	}
	if _, err := w.Write(ctx); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Errorf("Write() = %v, want ErrInvalidEvent", err)
	}
	// A duplicate event id is a database error: reported, nothing written.
	id := "0190f1f0-0000-7000-8000-000000000001"
	e := good
	e.ID = id
	if _, err := w.Write(ctx, e); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(ctx, e); err == nil {
		t.Fatal("second write of the same event id succeeded")
	}
	if n := countRows(t, db, "outbox_event", ""); n != 1 {
		t.Fatalf("%d events after duplicate, want 1", n)
	}
}

func TestNewWriterRefusesBadSchema(t *testing.T) {
	t.Parallel()
	if _, err := outbox.NewWriter(nil, outbox.WriterConfig{Schema: `x"; DROP TABLE y; --`}); err == nil {
		t.Fatal("NewWriter accepted an injection-looking schema")
	}
}

func TestPublisherWritesWatermillMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := pgtest.New(t)
	w := newWriter(t, db)

	// A fixed transaction.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":1}`))
	msg.Metadata.Set(core.MetadataPartitionKey, "k1")
	msg.Metadata.Set(core.MetadataEventType, "Thing")
	if err := w.TxPublisher(tx).Publish("things", msg); err != nil {
		t.Fatal(err)
	}
	badID := message.NewMessage("not-a-uuid", []byte(`{}`))
	badID.Metadata.Set(core.MetadataPartitionKey, "k")
	if err := w.TxPublisher(tx).Publish("things", badID); !errors.Is(err, core.ErrInvalidEventID) {
		t.Fatalf("message with bad id: %v, want ErrInvalidEventID", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Watermill's CQRS event bus over the context publisher.
	bus, err := cqrs.NewEventBusWithConfig(w.ContextPublisher().WithPartitionKey(func(string, *message.Message) (string, error) {
		return "customer-7", nil
	}), cqrs.EventBusConfig{
		GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) { return "events." + p.EventName, nil },
		Marshaler:            cqrs.JSONMarshaler{},
	})
	if err != nil {
		t.Fatal(err)
	}
	type CustomerRenamed struct{ Name string }
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return bus.Publish(core.ContextWithTx(ctx, tx), &CustomerRenamed{Name: "Ada"})
	}); err != nil {
		t.Fatal(err)
	}
	if err := bus.Publish(ctx, &CustomerRenamed{Name: "no tx"}); !errors.Is(err, outbox.ErrNoTx) {
		t.Fatalf("publish without a tx in context: %v, want ErrNoTx", err)
	}
	var topic, key, eventType, name string
	if err := db.Pool.QueryRow(ctx, `SELECT topic, partition_key, event_type, payload->>'Name' FROM "`+db.Schema+`".outbox_event WHERE topic LIKE 'events.%'`).
		Scan(&topic, &key, &eventType, &name); err != nil {
		t.Fatal(err)
	}
	if topic != "events.outbox_test.CustomerRenamed" && topic != "events.CustomerRenamed" || key != "customer-7" || name != "Ada" || eventType == "" {
		t.Fatalf("CQRS event stored as topic=%q key=%q type=%q name=%q", topic, key, eventType, name)
	}
	if n := countRows(t, db, "outbox_event", ""); n != 2 {
		t.Fatalf("%d events, want 2", n)
	}
}
