package saga

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ErrUnstorableData is wrapped by the error for saga data PostgreSQL's
// jsonb cannot hold: a string with a NUL character (the JSON escape
// \u0000, which a Go string with a NUL byte encodes to). A success reply
// whose OnSuccess puts one into the data parks the saga as stuck; a local
// step that does fails (as a core.Permanent error); StartTx refuses
// start data that holds one.
var ErrUnstorableData = errors.New(`saga: data holds \u0000, which PostgreSQL's jsonb cannot store`)

// nulEscape returns the offset of the first JSON escape \u0000 in the JSON
// text b, or -1. Backslashes only occur in strings, escaped in pairs, so
// an escape is recognised by skipping the character after each backslash.
func nulEscape(b []byte) int {
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+6 <= len(b) && b[i+1] == 'u' && string(b[i+2:i+6]) == "0000" {
			return i
		}
		i++ // the escaped character: "\\u0000" is a backslash and "u0000"
	}
	return -1
}

// checkStorable returns an error wrapping ErrUnstorableData if the JSON
// text data cannot be stored as jsonb.
func checkStorable(data []byte) error {
	if i := nulEscape(data); i >= 0 {
		return fmt.Errorf("%w (at byte %d)", ErrUnstorableData, i)
	}
	return nil
}

// storable makes JSON text the orchestrator writes itself (step state,
// history details) storable as jsonb, as clean does for text: each \u0000
// escape becomes \ufffd. It returns b itself when there is none.
func storable(b []byte) []byte {
	i := nulEscape(b)
	if i < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for i >= 0 {
		out = append(out, b[:i]...)
		out = append(out, `\ufffd`...)
		b = b[i+6:]
		i = nulEscape(b)
	}
	return append(out, b...)
}

// encodeSteps encodes a saga's step state for its jsonb column. The
// reasons in it come from participants' replies and local steps' errors:
// a NUL in one becomes U+FFFD, as in last_error.
func encodeSteps(steps map[string]*StepState) ([]byte, error) {
	b, err := json.Marshal(steps)
	if err != nil {
		return nil, err
	}
	return storable(b), nil
}
