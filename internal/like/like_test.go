package like

import "testing"

func TestCompile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pattern, s string
		want       bool
	}{
		{"%refund hold%", "credit: refund hold on account", true},
		{"%refund hold%", "refund held", false},
		{"refund%", "credit: refund hold", false},
		{"a_c", "abc", true},
		{"a_c", "abbc", false},
		{`100\%`, "100%", true},
		{`100\%`, "1000", false},
		{"%.*%", "no regexp here", false},
		{"%", "line one\nline two", true},
		{"", "", true},
	} {
		if got := Compile(c.pattern).MatchString(c.s); got != c.want {
			t.Errorf("%q LIKE %q = %v, want %v", c.s, c.pattern, got, c.want)
		}
	}
}
