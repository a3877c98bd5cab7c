package outbox

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/millrace/millrace/internal/pgtest"
)

// The insert's event ids encode as a uuid[] without a detour through text:
// a handful of allocations per id (a uuid.UUID's driver.Valuer took more
// than twenty, and an error built for each).
func TestEventIDsEncodeDirectly(t *testing.T) {
	rows := make([]eventRow, 50)
	for i := range rows {
		rows[i].id = uuid.New()
	}
	if a := pgtest.EncodeAllocs(t, pgtype.UUIDArrayOID, columns(rows)[0]) / float64(len(rows)); a > 5 {
		t.Errorf("%.1f allocations per event id; want at most 5", a)
	}
}

// The headers column gets what encoding/json would decode back to the
// metadata, whatever its text: quotes, backslashes, every control
// character, non-ASCII, characters JSON may leave raw.
func TestHeadersJSONDecodes(t *testing.T) {
	var controls strings.Builder
	for c := rune(1); c < 0x20; c++ {
		controls.WriteRune(c)
	}
	for _, m := range []map[string]string{
		{"a": "b"},
		{"saga_id": "s-1", "step": "credit", "attempt": "3", "empty": ""},
		{`q"uote`: `back\slash`, "controls": controls.String(), "del": "\x7f", "html": "<a href='x'>&</a>"},
		{"日本": "語", "sep": "\u2028\u2029", "emoji": "😀", "replacement": "\ufffd"},
	} {
		b := headersJSON(m)
		var got map[string]string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if !maps.Equal(got, m) {
			t.Errorf("decoded %q, want %q", got, m)
		}
	}
}

func BenchmarkHeaders(b *testing.B) {
	m := map[string]string{"saga_id": "s-12345", "saga_type": "order", "step": "credit", "operation": "action",
		"attempt": "1", "event_id": uuid.NewString(), "partition_key": "s-12345", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	b.Run("headersJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = headersJSON(m)
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = json.Marshal(m)
		}
	})
}

// decodeHeaders gives what encoding/json gives whenever it decodes, and
// leaves to encoding/json what it does not (escapes, other JSON, text
// that is not UTF-8). The seeds run in go test; go test -fuzz tries more.
func FuzzDecodeHeaders(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `{"a": "b"}`, `{"a":"b","c":"d"}`, "{\n\t\"a\" :\r\"b\" ,\"\":\"\"}",
		`{"a": "b", "a": "c"}`, `{"日本": "語", "emoji": "😀"}`, `{"q": "say \"hi\""}`, `{"u": "\u00e9"}`,
		`{"a": 1}`, `{"a": null}`, `{"a": "b",}`, `{"a" "b"}`, `{"a": "b"} x`, `["a"]`, `"a"`, ``, `{`,
		"{\"a\": \"\x01\"}", "{\"a\": \"\xff\"}", `{"a": "b"`, `{"a": {"b": "c"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeHeaders(b)
		if !ok {
			return
		}
		var want map[string]string
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatalf("%q: decodeHeaders decoded %q, encoding/json failed: %v", b, got, err)
		}
		if !maps.Equal(got, want) || got == nil {
			t.Fatalf("%q: decodeHeaders decoded %q, encoding/json %q", b, got, want)
		}
	})
}

// The headers PostgreSQL prints for the writer's metadata take the fast
// way: no escapes in them.
func TestDecodeHeadersTakesPlainMetadata(t *testing.T) {
	for _, s := range []string{`{}`, `{"step": "credit", "saga_id": "s-1", "attempt": "1"}`} {
		if _, ok := decodeHeaders([]byte(s)); !ok {
			t.Errorf("%s: left to encoding/json", s)
		}
	}
}

func BenchmarkDecodeHeaders(b *testing.B) {
	headers := []byte(`{"step": "credit", "attempt": "1", "saga_id": "s-12345", "event_id": "0190c0d2-7e2a-7c3e-9d2b-3f4a5b6c7d8e", "operation": "action", "saga_type": "order", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "partition_key": "s-12345"}`)
	b.Run("decodeHeaders", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := decodeHeaders(headers); !ok {
				b.Fatal("not decoded")
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var md map[string]string
			if err := json.Unmarshal(headers, &md); err != nil {
				b.Fatal(err)
			}
		}
	})
}
