package saga

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/millrace/millrace/core"
)

// FuzzParseReply: whatever the headers and payload, parseReply either
// refuses the message with a permanent ErrBadReply or returns a reply
// whose identifiers can be stored (valid UTF-8, no NUL, at most 200 bytes)
// and whose payload is JSON.
func FuzzParseReply(f *testing.F) {
	f.Add("saga-1", "credit", "1", "action", "success", "", []byte(`{}`))
	f.Add("saga-1", "credit", "2", "compensation", "failure", "no money", []byte(``))
	f.Add("s\x00", "st\xff", "-1", "x", "y", "\x00", []byte(`{`))
	f.Fuzz(func(t *testing.T, id, step, attempt, op, outcome, reason string, payload []byte) {
		r, err := parseReply(map[string]string{
			core.MetadataSagaID: id, core.MetadataSagaStep: step, core.MetadataSagaAttempt: attempt,
			core.MetadataSagaOperation: op, core.MetadataSagaOutcome: outcome, core.MetadataSagaReason: reason,
		}, payload)
		if err != nil {
			if !errors.Is(err, ErrBadReply) || !core.IsPermanent(err) {
				t.Fatalf("error %v is not a permanent ErrBadReply", err)
			}
			return
		}
		for _, s := range []string{r.sagaID, r.step} {
			if checkName(s) != nil {
				t.Fatalf("accepted identifier %q", s)
			}
		}
		if r.attempt < 1 {
			t.Fatalf("attempt %d", r.attempt)
		}
		if c := oneLine(r.reason); !utf8.ValidString(c) || len(c) > 2000 || strings.Contains(c, "\x00") {
			t.Fatalf("reason %q not made storable: %q", r.reason, c)
		}
	})
}
