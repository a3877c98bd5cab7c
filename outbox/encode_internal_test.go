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
