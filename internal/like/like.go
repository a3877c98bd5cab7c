// Package like matches text against SQL LIKE patterns in Go, for the bulk
// dead-letter actions that filter on a listing's rows (the same pattern
// language as saga.Query.Error, which PostgreSQL matches).
package like

import (
	"regexp"
	"strings"
)

// Compile returns a matcher for pattern: % matches any run of characters,
// _ any one character, and \ makes the next character literal. Like
// PostgreSQL's LIKE, the whole text must match.
func Compile(pattern string) *regexp.Regexp {
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
		b.WriteString(regexp.QuoteMeta(`\`))
	}
	b.WriteString(`\z`)
	return regexp.MustCompile(b.String())
}
