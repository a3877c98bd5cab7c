// Package like matches text against SQL LIKE patterns in Go, for the bulk
// dead-letter actions that filter on a listing's rows (the same pattern
// language as saga.Query.Error, which PostgreSQL matches), the way
// PostgreSQL's LIKE does: a pattern it refuses is refused here too, so
// a dry run and the action it previews select the same rows whichever
// side matches.
package like

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// ErrPattern is wrapped by Compile's error for a pattern PostgreSQL's LIKE
// refuses: one that ends with the escape character \, or is not valid
// UTF-8.
var ErrPattern = errors.New("invalid LIKE pattern")

// Compile returns a matcher for pattern: % matches any run of characters,
// _ any one character, and \ makes the next character literal. Like
// PostgreSQL's LIKE, the whole text must match, and a pattern ending with
// an unescaped \ or holding invalid UTF-8 is an error wrapping ErrPattern.
func Compile(pattern string) (*regexp.Regexp, error) {
	if !utf8.ValidString(pattern) {
		return nil, fmt.Errorf("%w %q: not valid UTF-8", ErrPattern, pattern)
	}
	var b strings.Builder
	b.WriteString(`(?s)\A`)
	esc := false
	for _, r := range pattern {
		switch {
		case esc:
			b.WriteString(regexp.QuoteMeta(string(r)))
			esc = false
		case r == '\\':
			esc = true
		case r == '%':
			b.WriteString(`.*`)
		case r == '_':
			b.WriteString(`.`)
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	if esc {
		return nil, fmt.Errorf("%w %q: it ends with the escape character \\", ErrPattern, pattern)
	}
	b.WriteString(`\z`)
	return regexp.MustCompile(b.String()), nil
}
