package sqlident

import "testing"

func TestValidateSchema(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"millrace", "_x", "a1_b2", "t_0123456789abcdef"} {
		if err := ValidateSchema(ok); err != nil {
			t.Errorf("ValidateSchema(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "x\"; DROP TABLE y; --", "1abc", "Upper", "a-b", "a b", "a.b", string(make([]byte, 64))} {
		if err := ValidateSchema(bad); err == nil {
			t.Errorf("ValidateSchema(%q) = nil, want error", bad)
		}
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	if got, want := Table("millrace", "outbox_event"), `"millrace"."outbox_event"`; got != want {
		t.Fatalf("Table = %s, want %s", got, want)
	}
}

func FuzzValidateSchema(f *testing.F) {
	f.Add("millrace")
	f.Add(`x"; DROP TABLE y; --`)
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateSchema(s) == nil {
			for _, r := range s {
				if !(r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')) {
					t.Fatalf("accepted %q with rune %q", s, r)
				}
			}
		}
	})
}
