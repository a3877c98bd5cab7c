package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/millrace/millrace/internal/pgtest"
	"github.com/millrace/millrace/outbox"
)

// FuzzWriteTx checks WriteTx's promise on any input: either an *EventError
// before anything is sent (the transaction still works), or the event
// stored exactly as given. Never a database error. The seeds run in every
// go test; go test -fuzz FuzzWriteTx ./outbox/ explores further.
func FuzzWriteTx(f *testing.F) {
	f.Add("orders", "customer-7", "OrderPlaced", []byte(`{"b":1,"a":2,"a":3,"n":1.50e2}`), false, "traceparent", "00-1-2-01")
	f.Add("or\x00ders", "k", "", []byte(`{}`), false, "", "")
	f.Add("t", "k\xff", "E", []byte(`{}`), false, "k", "v")
	f.Add("t", "k", "E", []byte("{\"a\":\"\\u0000\"}"), false, "k", "v\x00")
	f.Add("t", "k", "E", []byte("\x00\xff binary"), true, "content_type", "application/json")
	f.Add("t", "k", "E", []byte("{\"a\":\"\xff\"}"), false, "partition_key", "k")
	f.Add("t", "k", "E", []byte(`[]`), false, "\xc3\x28", "x")
	db := pgtest.New(f)
	w := newWriter(f, db)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, topic, key, eventType string, payload []byte, binary bool, mdKey, mdVal string) {
		e := outbox.Event{Topic: topic, PartitionKey: key, EventType: eventType, Payload: payload, Binary: binary}
		if mdKey != "" || mdVal != "" {
			e.Metadata = map[string]string{mdKey: mdVal}
		}
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		ids, err := w.WriteTx(ctx, tx, e)
		if err != nil {
			var ee *outbox.EventError
			if !errors.As(err, &ee) {
				t.Fatalf("WriteTx(%+v) = %v, want nil or an *EventError", e, err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
				t.Fatalf("transaction unusable after %v: %v", ee, err)
			}
			return
		}
		var (
			gotTopic, gotKey, gotType string
			gotPayload, gotBytes      []byte
			gotMeta                   map[string]string
		)
		err = tx.QueryRow(ctx, `SELECT topic, partition_key, event_type, convert_to(payload::text, 'UTF8'), payload_bytes, headers
  FROM "`+db.Schema+`".outbox_event WHERE event_id = $1 AND topic = $2`, ids[0], topic).
			Scan(&gotTopic, &gotKey, &gotType, &gotPayload, &gotBytes, &gotMeta)
		if err != nil {
			t.Fatal(err)
		}
		stored := gotPayload
		if binary {
			stored = gotBytes
		}
		if gotTopic != topic || gotKey != key || gotType != eventType || string(stored) != string(payload) {
			t.Fatalf("stored %q %q %q %q, written %q %q %q %q", gotTopic, gotKey, gotType, stored, topic, key, eventType, payload)
		}
		want, _ := json.Marshal(e.Metadata)
		got, _ := json.Marshal(gotMeta)
		if len(e.Metadata) > 0 && string(want) != string(got) {
			t.Fatalf("metadata stored as %s, written %s", got, want)
		}
	})
}
