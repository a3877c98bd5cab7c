package outbox

import (
	"testing"
	"time"
)

// A Writer's hint goes out at most once per NotifyInterval, 1ms by
// default: an event written 1.5ms after an announced one carries a hint of
// its own (with the 2ms default of before it did not, and waited for the
// relay's short look). Hints off, and in CDC mode, none goes out.
func TestWriterHintsAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	w, err := NewWriter(nil, WriterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(w.notifyInterval); got != time.Millisecond {
		t.Fatalf("default NotifyInterval %s, want 1ms", got)
	}
	if !w.notifyDue() {
		t.Fatal("first write carries no hint")
	}
	// A hint sent (as if) later than now: the next write is inside the
	// interval, whatever the machine's speed.
	w.lastNotify.Store(time.Now().Add(time.Second).UnixNano())
	if w.notifyDue() {
		t.Fatal("a write within the interval after a hint carries one too")
	}
	w.lastNotify.Store(time.Now().Add(-1500 * time.Microsecond).UnixNano())
	if !w.notifyDue() {
		t.Fatal("a write 1.5ms after the last hint carries none")
	}
	if w.notifyDue() {
		t.Fatal("two writes at once both carry a hint")
	}

	for name, cfg := range map[string]WriterConfig{"off": {NotifyInterval: -1}, "cdc": {CDC: true}} {
		w, err := NewWriter(nil, cfg)
		if err != nil {
			t.Fatal(err)
		}
		w.lastNotify.Store(time.Now().Add(-time.Hour).UnixNano())
		if w.notifyDue() {
			t.Errorf("%s: a write carries a hint", name)
		}
	}
}
