package inbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/millrace/millrace/core"
	"github.com/millrace/millrace/inbox"
)

// FuzzReceiverKeepsTextOrRefusesIt: whatever a message's partition key and
// metadata hold, the Receiver either stores them so that they come back
// byte for byte, or refuses the message with a permanent ErrUnstorable and
// stores nothing. Never a database error, never a changed byte.
func FuzzReceiverKeepsTextOrRefusesIt(f *testing.F) {
	for _, s := range [][3]string{
		{"k", "trace", "abc"},
		{"k\x00", "trace", "abc"},
		{"k", "tr\x00ace", "abc"},
		{"k", "trace", "a\x00"},
		{"k\xff", "trace", "abc"},
		{"k", "tr\xc3", "abc"},
		{"k", "trace", "\xed\xa0\x80"}, // an encoded surrogate
		{"ключ", "héader", "välue \U0001F600 \\u0000 \"q\" <&> \u2028"},
		{"", "", ""},
	} {
		f.Add(s[0], s[1], s[2], []byte{0, 0xff})
	}
	b := setup(f, 2)
	r := newReceiver(f, b, "c")
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, key, mdKey, mdValue string, payload []byte) {
		m := message.NewMessage(uuid.NewString(), payload)
		m.Metadata.Set(core.MetadataPartitionKey, key)
		m.Metadata.Set(mdKey, mdValue)
		n, err := r.Receive(ctx, m)
		if err != nil {
			if !errors.Is(err, inbox.ErrUnstorable) || !core.IsPermanent(err) {
				t.Fatalf("Receive(key %q, %q: %q) = %v; want nil or a permanent ErrUnstorable", key, mdKey, mdValue, err)
			}
			if got := b.count(t, `SELECT count(*) FROM `+b.table("inbox_event")+` WHERE event_id = $1`, m.UUID); got != 0 {
				t.Fatal("a refused message was stored")
			}
			return
		}
		if n != 1 {
			t.Fatalf("Receive stored %d", n)
		}
		var (
			gotKey     string
			gotPayload []byte
			gotMD      map[string]string
		)
		if err := b.db.Pool.QueryRow(ctx, `SELECT partition_key, payload, metadata FROM `+b.table("inbox_event")+` WHERE event_id = $1`, m.UUID).Scan(&gotKey, &gotPayload, &gotMD); err != nil {
			t.Fatal(err)
		}
		if gotKey != m.Metadata.Get(core.MetadataPartitionKey) || string(gotPayload) != string(payload) || len(gotMD) != len(m.Metadata) {
			t.Fatalf("stored key %q payload %x metadata %q; sent %q %x %q", gotKey, gotPayload, gotMD, key, payload, m.Metadata)
		}
		for k, v := range m.Metadata {
			if gotMD[k] != v {
				t.Fatalf("metadata %q stored as %q, sent %q", k, gotMD[k], v)
			}
		}
	})
}
