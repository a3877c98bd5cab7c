package saga

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// ErrUnstorableData is wrapped by the error for saga data (or an event's
// payload) that PostgreSQL's jsonb cannot hold, although it is JSON: a
// string with a NUL character (the escape \u0000, which a Go string with a
// NUL byte encodes to), a lone UTF-16 surrogate escape (\ud800 without its
// low half, which a json.RawMessage can carry), invalid UTF-8, or a number
// outside the range of PostgreSQL's numeric (1e999999, 1e-20000: more than
// 131072 digits before the decimal point or 16383 after it). A success
// reply whose OnSuccess puts one into the data parks the saga as stuck,
// as does an event whose OnEvent does; a local step that does fails (as a
// core.Permanent error); StartTx refuses start data that holds one.
var ErrUnstorableData = errors.New("saga: data holds what PostgreSQL's jsonb cannot store")

// The limits of PostgreSQL's numeric, which jsonb stores numbers as: the
// weight of the first non-zero base-10000 digit is an int16, the display
// scale (digits after the decimal point) at most numericDscaleMax, and the
// input's exponent less than numericExponentMax in size (numeric.c).
const (
	numericWeightMin   = -32768
	numericWeightMax   = 32767
	numericDscaleMax   = 0x3FFF
	numericExponentMax = 1<<31/2 - 1 // INT_MAX / 2
)

// jsonbProblem scans the JSON text b (valid JSON) as jsonb's input
// function reads it and returns the offset of the first thing jsonb
// refuses and what it is, or -1. fix, if not nil, is called for each
// escape that a replacement character makes storable (a \u0000 escape, a
// lone surrogate escape: offset and length) instead of reporting it.
func jsonbProblem(b []byte, fix func(at, n int)) (int, string) {
	if !utf8.Valid(b) {
		for i := 0; i < len(b); {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return i, "invalid UTF-8"
			}
			i += n
		}
	}
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '"':
			end, at, what := jsonbString(b, i+1, fix)
			if at >= 0 {
				return at, what
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end, ok := numericInRange(b, i)
			if !ok {
				return i, "a number outside the range of PostgreSQL's numeric"
			}
			i = end
		default:
			i++
		}
	}
	return -1, ""
}

// jsonbString reads the string whose text begins at b[i] (after its
// opening quote) and returns the offset after its closing quote, or where
// jsonb refuses it: a \u0000 escape, or a surrogate escape that is not a
// high one followed at once by a low one (as PostgreSQL's JSON lexer).
func jsonbString(b []byte, i int, fix func(at, n int)) (end, at int, what string) {
	pending := -1 // the offset of a high surrogate escape waiting for its low half
	lone := func() (int, string) {
		if fix != nil {
			fix(pending, 6)
			pending = -1
			return -1, ""
		}
		return pending, "a lone UTF-16 surrogate escape"
	}
	for i < len(b) {
		c := b[i]
		if c == '"' || c != '\\' || b[i+1] != 'u' {
			if pending >= 0 {
				if at, what := lone(); at >= 0 {
					return 0, at, what
				}
			}
			if c == '"' {
				return i + 1, -1, ""
			}
			if c == '\\' {
				i++ // the escaped character (a quote or a backslash is not the string's end)
			}
			i++
			continue
		}
		var u rune
		for _, h := range b[i+2 : i+6] {
			u = u<<4 | rune(hexValue(h))
		}
		switch {
		case u == 0:
			if fix == nil {
				return 0, i, `\u0000`
			}
			if pending >= 0 {
				if at, what := lone(); at >= 0 {
					return 0, at, what
				}
			}
			fix(i, 6)
		case u >= 0xD800 && u < 0xDC00:
			if pending >= 0 {
				if at, what := lone(); at >= 0 {
					return 0, at, what
				}
			}
			pending = i
		case u >= 0xDC00 && u < 0xE000:
			if pending < 0 {
				pending = i // a low half alone: as lone as a high one
				if at, what := lone(); at >= 0 {
					return 0, at, what
				}
			}
			pending = -1
		default:
			if pending >= 0 {
				if at, what := lone(); at >= 0 {
					return 0, at, what
				}
			}
		}
		i += 6
	}
	return i, -1, ""
}

func hexValue(h byte) byte {
	switch {
	case h >= '0' && h <= '9':
		return h - '0'
	case h >= 'a' && h <= 'f':
		return h - 'a' + 10
	default:
		return h - 'A' + 10
	}
}

// numericInRange reads the JSON number at b[i] and reports whether
// PostgreSQL's numeric holds it (set_var_from_str and make_result in
// numeric.c): an exponent under numericExponentMax in size, a display
// scale (fraction digits less the exponent, at least 0) of at most
// numericDscaleMax, and the base-10000 weight of its first non-zero digit
// an int16. It returns the offset after the number.
func numericInRange(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	intStart := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	intDigits := b[intStart:i]
	var fracDigits []byte
	if i < len(b) && b[i] == '.' {
		i++
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		fracDigits = b[s:i]
	}
	var exp int64
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		neg := false
		if b[i] == '+' || b[i] == '-' {
			neg = b[i] == '-'
			i++
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			if exp < numericExponentMax {
				exp = exp*10 + int64(b[i]-'0')
			}
			i++
		}
		if exp >= numericExponentMax {
			return i, false
		}
		if neg {
			exp = -exp
		}
	}
	if max(int64(len(fracDigits))-exp, 0) > numericDscaleMax {
		return i, false
	}
	// w is the decimal weight of the first non-zero digit (0 for 1, -1
	// for 0.1).
	digits := append(intDigits[:len(intDigits):len(intDigits)], fracDigits...)
	k := slices.IndexFunc(digits, func(c byte) bool { return c != '0' })
	if k < 0 {
		return i, true // zero
	}
	w := int64(len(intDigits)-1-k) + exp
	weight := w / 4 // floored: the base-10000 digit that holds it
	if w < 0 && w%4 != 0 {
		weight--
	}
	return i, weight >= numericWeightMin && weight <= numericWeightMax
}

// checkStorable returns an error wrapping ErrUnstorableData if the JSON
// text data cannot be stored as jsonb.
func checkStorable(data []byte) error {
	if at, what := jsonbProblem(data, nil); at >= 0 {
		return fmt.Errorf("%w: %s (at byte %d)", ErrUnstorableData, what, at)
	}
	return nil
}

// storable makes JSON text storable as jsonb where a replacement character
// can, as clean does for text: invalid UTF-8, each \u0000 escape and each
// lone surrogate escape become U+FFFD. It returns b itself when there is
// nothing to replace. A number jsonb cannot hold is left as it is (see
// checkStorable).
func storable(b []byte) []byte {
	if !utf8.Valid(b) {
		b = []byte(strings.ToValidUTF8(string(b), "\uFFFD"))
	}
	var at []int
	jsonbProblem(b, func(i, _ int) { at = append(at, i) })
	if len(at) == 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	prev := 0
	for _, i := range at {
		out = append(out, b[prev:i]...)
		out = append(out, `\ufffd`...)
		prev = i + 6
	}
	return append(out, b[prev:]...)
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
