package like

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millrace/millrace/internal/pgtest"
)

var cases = []struct {
	pattern, s string
}{
	{"%refund hold%", "credit: refund hold on account"},
	{"%refund hold%", "refund held"},
	{"refund%", "credit: refund hold"},
	{"a_c", "abc"},
	{"a_c", "abbc"},
	{"a_c", "aéc"},
	{"a_c", "a\nc"},
	{`100\%`, "100%"},
	{`100\%`, "1000"},
	{`a\_c`, "a_c"},
	{`a\_c`, "abc"},
	{`\\`, `\`},
	{`a\\%`, `a\b`},
	{`\a`, "a"},
	{`\é`, "é"},
	{"%.*%", "no regexp here"},
	{"%", "line one\nline two"},
	{"", ""},
	{"", "x"},
	{`abc\`, `abc\`},
	{`abc\`, "abc"},
	{`%\`, "x"},
	{`\\\`, `\\`},
	{"\xff%", "\ufffd!"},
	{"a\xc3", "a\ufffd"},
	{"\ufffd", "\ufffd"},
	{"_", "\U0001F600"},
	{"__", "\U0001F600"},
}

// Compile agrees with PostgreSQL's LIKE on every case: the same match, or
// an error where PostgreSQL refuses the pattern. PostgreSQL refuses a
// trailing escape only when matching reaches it ("abc" LIKE 'abc\' is
// false, "abc\" LIKE 'abc\' an error); Compile refuses such a pattern
// whatever the text, so a dry run never selects rows its action would fail
// on.
func TestCompileAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	db := pgtest.NewWith(t, pgtest.Options{MaxConns: 1})
	pgRefuses := map[string]bool{} // patterns PostgreSQL refused on some text
	type verdict struct {
		match bool
		err   error
	}
	pgs := make([]verdict, len(cases))
	for i, c := range cases {
		err := db.Pool.QueryRow(context.Background(), `SELECT $1::text LIKE $2::text`, c.s, c.pattern).Scan(&pgs[i].match)
		var pgErr *pgconn.PgError
		if err != nil && !errors.As(err, &pgErr) {
			t.Fatal(err)
		}
		if pgs[i].err = err; err != nil {
			pgRefuses[c.pattern] = true
		}
	}
	for i, c := range cases {
		pg := pgs[i]
		re, err := Compile(c.pattern)
		switch {
		case err != nil && !errors.Is(err, ErrPattern):
			t.Errorf("Compile(%q): %v, want ErrPattern", c.pattern, err)
		case err != nil && !pgRefuses[c.pattern]:
			t.Errorf("Compile(%q): %v, but PostgreSQL takes it", c.pattern, err)
		case err == nil && pg.err != nil:
			t.Errorf("%q LIKE %q: PostgreSQL %v, Compile takes it", c.s, c.pattern, pg.err)
		case err == nil && re.MatchString(c.s) != pg.match:
			t.Errorf("%q LIKE %q: PostgreSQL %v, Compile %v", c.s, c.pattern, pg.match, re.MatchString(c.s))
		}
	}
}
