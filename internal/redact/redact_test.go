package redact

import "testing"

func TestJSON(t *testing.T) {
	t.Parallel()
	in := `{"id":"o-1","card":{"number":"4111","exp":"12/29"},"items":[{"sku":"a","Email":"x@y"}],"n":1.50,"ok":true,"none":null}`
	for _, c := range []struct {
		fields []string
		want   string
	}{
		{nil, `{"id":"[redacted]","card":{"number":"[redacted]","exp":"[redacted]"},"items":[{"sku":"[redacted]","Email":"[redacted]"}],"n":"[redacted]","ok":"[redacted]","none":"[redacted]"}`},
		{[]string{"card", "email"}, `{"id":"o-1","card":{"number":"[redacted]","exp":"[redacted]"},"items":[{"sku":"a","Email":"[redacted]"}],"n":1.50,"ok":true,"none":null}`},
		{[]string{"nothing"}, `{"id":"o-1","card":{"number":"4111","exp":"12/29"},"items":[{"sku":"a","Email":"x@y"}],"n":1.50,"ok":true,"none":null}`},
	} {
		got, ok := JSON([]byte(in), c.fields...)
		if !ok || string(got) != c.want {
			t.Errorf("fields %v:\n got %s (%v)\nwant %s", c.fields, got, ok, c.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} {"b":2}`, "\x00\x01binary", `{"a":1,}`} {
		if got, ok := JSON([]byte(bad)); ok {
			t.Errorf("%q: %s, want not JSON", bad, got)
		}
	}
	if got, ok := JSON([]byte(`"a secret"`)); !ok || string(got) != Mask {
		t.Errorf("a bare string: %s %v", got, ok)
	}
}

func FuzzJSON(f *testing.F) {
	f.Add([]byte(`{"a":[1,{"b":"c"}]}`), "b")
	f.Fuzz(func(t *testing.T, in []byte, field string) {
		out, ok := JSON(in, field)
		if !ok {
			return
		}
		if _, ok := JSON(out, field); !ok {
			t.Fatalf("redacted %q to %q, which is not JSON", in, out)
		}
	})
}
