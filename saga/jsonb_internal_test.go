package saga

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestStorableReplacesOnlyNULEscapes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":"x"}`, `{"a":"x"}`},
		{`{"a":"x\u0000y"}`, `{"a":"x\ufffdy"}`},
		{`{"a":"\\u0000"}`, `{"a":"\\u0000"}`}, // a backslash, then "u0000": no NUL
		{`{"a":"\\\u0000"}`, `{"a":"\\\ufffd"}`},
		{`["\u0000","\u0000"]`, `["\ufffd","\ufffd"]`},
		{`"\u00001"`, `"\ufffd1"`},
	} {
		got := string(storable([]byte(c.in)))
		if got != c.want {
			t.Errorf("storable(%s) = %s, want %s", c.in, got, c.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("storable(%s) = %s: not JSON", c.in, got)
		}
		if (checkStorable([]byte(c.in)) == nil) != (c.in == c.want) {
			t.Errorf("checkStorable(%s) disagrees", c.in)
		}
	}
}

func TestOnlySkipped(t *testing.T) {
	a, b := skipped{errors.New("a")}, skipped{errors.New("b")}
	if !onlySkipped(a) || !onlySkipped(errors.Join(a, b)) || !onlySkipped(errors.Join(nil, errors.Join(a, b))) {
		t.Error("skipped failures not recognised")
	}
	if onlySkipped(errors.New("pass")) || onlySkipped(errors.Join(a, errors.New("pass"))) {
		t.Error("a failure of the pass taken for a skipped one")
	}
}
