package saga

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/internal/pgtest"
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

// jsonbCases are JSON texts at the edges of what jsonb accepts: NUL and
// surrogate escapes, invalid UTF-8, and numbers at numeric's limits.
var jsonbCases = []string{
	`{"a":"x"}`, `"\u0000"`, `"\\u0000"`, `"\\\u0000"`, `"a\u0000b"`,
	`"\ud800"`, `"\udc00"`, `"\ud800\udc00"`, `"\udbff\udfff"`, `"\ud800x"`, `"\ud800\u0041"`,
	`"\ud800\ud800\udc00"`, `"\ud800\\n"`, `"\udc00\ud800"`, `{"\ud800":1}`, `"\uD800\uDC00"`, `"\ud800\u0000"`,
	`["\ud800","x"]`, `["\ud83d\ude00","\ud83d"]`, `"é\u00e9"`, "\"\xff\"", "\"a\xc3\"", "[\"ok\",\"\xed\xa0\x80\"]",
	`1e999999`, `1e-999999`, `1e1000`, `1e131071`, `1e131072`, `-1e131072`, `1e-16383`, `1e-16384`, `1.5e-16383`,
	`0e999999`, `0.0e-99999`, `0e-16383`, `0e-16384`, `0e1073741822`, `0e1073741823`, `0e99999999999999999999`,
	`1e-131072`, `0.00001e-16378`, `0.00001e-16379`, `10e131070`, `100e131069`, `0.1e131072`, `0.01e131073`,
	`1000e131068`, `10000e131068`, `1E+1000`, `-0`, `-0.0e-16383`, `[1e131072]`, `{"n":1e-16384}`,
	`0.` + strings.Repeat("0", 16382) + `1`, `0.` + strings.Repeat("0", 16383) + `1`, `1` + strings.Repeat("0", 131071),
	`1` + strings.Repeat("0", 131072), `0.` + strings.Repeat("0", 16383), `-0.` + strings.Repeat("0", 20000),
}

// randomJSON builds a JSON array of strings and numbers drawn from the
// edges above, mixed.
func randomJSON(rng *rand.Rand) string {
	escapes := []string{`\u0000`, `\ud800`, `\udbff`, `\udc00`, `\udfff`, `\u0041`, `\n`, `\\`, `\"`, `x`, `é`, `\ud83d\ude00`, "\xff"}
	var b strings.Builder
	b.WriteString("[")
	for k := range 1 + rng.IntN(3) {
		if k > 0 {
			b.WriteString(",")
		}
		if rng.IntN(2) == 0 {
			b.WriteString(`"`)
			for range rng.IntN(4) {
				b.WriteString(escapes[rng.IntN(len(escapes))])
			}
			b.WriteString(`"`)
			continue
		}
		ints := []string{"0", "1", "10", "9999", "00001"[4:], "12345"}
		b.WriteString([]string{"", "-"}[rng.IntN(2)])
		b.WriteString(ints[rng.IntN(len(ints))])
		if rng.IntN(2) == 0 {
			b.WriteString("." + []string{"0", "5", "0001", "00000"}[rng.IntN(4)])
		}
		if rng.IntN(3) > 0 {
			exps := []int{0, 1, 1000, 16378, 16379, 16382, 16383, 16384, 131067, 131068, 131071, 131072, 131075, 1073741822, 1073741823}
			b.WriteString("e" + []string{"", "+", "-"}[rng.IntN(3)] + strconv.Itoa(exps[rng.IntN(len(exps))]))
		}
	}
	b.WriteString("]")
	return b.String()
}

// checkStorable agrees with PostgreSQL on every case and on random mixes:
// it refuses exactly what a jsonb cast refuses, and storable's output is
// what jsonb takes unless a number is out of range.
func TestStorableAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 1})
	ctx := context.Background()
	cases := slices.Clone(jsonbCases)
	rng := rand.New(rand.NewPCG(39, 5))
	for range 1500 {
		cases = append(cases, randomJSON(rng))
	}
	accepts := func(s string) (bool, error) {
		_, err := db.Pool.Exec(ctx, `SELECT $1::text::jsonb`, s)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			return false, nil
		}
		return err == nil, err
	}
	for _, c := range cases {
		if !json.Valid([]byte(c)) {
			t.Fatalf("case %.80q is not JSON", c)
		}
		pg, err := accepts(c)
		if err != nil {
			t.Fatal(err)
		}
		if got := checkStorable([]byte(c)) == nil; got != pg {
			t.Errorf("%.80q: checkStorable says storable %v, PostgreSQL %v", c, got, pg)
		}
		fixed := storable([]byte(c))
		if !json.Valid(fixed) {
			t.Errorf("storable(%.80q) = %.80q: not JSON", c, fixed)
		}
		pg, err = accepts(string(fixed))
		if err != nil {
			t.Fatal(err)
		}
		if got := checkStorable(fixed); pg != (got == nil) || (got != nil && !strings.Contains(got.Error(), "number")) {
			t.Errorf("storable(%.80q) = %.80q: PostgreSQL takes it: %v; checkStorable: %v", c, fixed, pg, got)
		}
	}
}
