// Package sqlident validates and quotes the SQL identifiers (schema names)
// that millrace users configure, so that nothing a user passes is spliced
// into SQL unquoted.
package sqlident

import (
	"fmt"
	"hash/fnv"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema millrace's tables live in unless configured.
const DefaultSchema = "millrace"

var valid = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// ValidateSchema returns an error unless name is a plain lower-case
// PostgreSQL identifier: a letter or underscore, then letters, digits or
// underscores, at most 63 bytes. Names that would need quoting are refused
// rather than quoted, so the same name works in psql without surprises.
func ValidateSchema(name string) error {
	if !valid.MatchString(name) {
		return fmt.Errorf("millrace: invalid schema name %q: use 1-63 lower-case letters, digits or underscores, not starting with a digit", name)
	}
	return nil
}

// Schema returns name validated, or DefaultSchema when name is empty.
func Schema(name string) (string, error) {
	if name == "" {
		return DefaultSchema, nil
	}
	if err := ValidateSchema(name); err != nil {
		return "", err
	}
	return name, nil
}

// Quote returns name quoted as a PostgreSQL identifier.
func Quote(name string) string { return pgx.Identifier{name}.Sanitize() }

// Table returns schema.table, both quoted.
func Table(schema, table string) string { return pgx.Identifier{schema, table}.Sanitize() }

// Hash returns 8 hex digits derived from name: a short, identifier-safe tag
// for names (channels, prepared statements) that must stay within
// PostgreSQL's 63-byte limit whatever the schema is called.
func Hash(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%08x", h.Sum32())
}

// AnyParam is the right side of "col = AnyParam(...)": any element of the
// array parameter param (such as "$1"), of element type typ (such as
// "int8"), through an InitPlan. With "col = ANY($1)" PostgreSQL plans a
// prepared statement again at nearly every execution: a plan made for a
// batch's few values always looks cheaper than the generic plan, whose
// array has an unknown length. An InitPlan's array has an unknown length
// for both, so PostgreSQL keeps the generic plan after its first five
// executions: on an indexed column, the same index scan. Not for a column
// matched by a scan of the table: PostgreSQL hashes a parameter's array
// there, and matches an InitPlan's one element after another.
func AnyParam(param, typ string) string {
	return "ANY(ARRAY(SELECT unnest(" + param + "::" + typ + "[])))"
}
