package millrace_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/millrace/millrace/internal/pgtest"
)

// The repository's code and docs say what a rule is, never cite the id of
// a source document that is not in the repository, and name no file that
// is not there.
func TestDocsCiteNoAbsentDocuments(t *testing.T) {
	t.Parallel()
	ruleID := regexp.MustCompile(`\bR-[A-Z]+-[A-Z]+-X?[0-9]+\b|\bDESIGN\.md\b`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if path == "docs_test.go" {
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".html", "":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := ruleID.FindString(line); m != "" {
				t.Errorf("%s:%d cites %s, which is not in the repository: say what it is instead", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Every Example function can be pasted into a user's own module: a test
// file that declares one imports no internal package, since a user's
// module cannot.
func TestExamplesUseOnlyThePublicAPI(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	examples := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		var names []string
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") {
				names = append(names, fn.Name.Name)
			}
		}
		if len(names) == 0 {
			return nil
		}
		examples += len(names)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s (%s) imports %s: an Example must use only the public API so a user can paste it", path, strings.Join(names, ", "), p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if examples == 0 {
		t.Fatal("found no Example functions: the walk is broken")
	}
}

// The programs under examples/ are what a user copies to start a service:
// their non-test files import no internal package either.
func TestExampleProgramsUseOnlyThePublicAPI(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir("examples", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s imports %s: an example program must use only the public API so a user can copy it", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("found no example programs: the walk is broken")
	}
}

// docs/tables.md names every column of every table the migrations create,
// and nothing else: a migration that adds a column fails this test until
// the page says what the column is.
func TestTablesDocNamesEveryColumn(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rows, err := db.Pool.Query(context.Background(), `SELECT c.table_name, c.column_name
  FROM information_schema.columns c JOIN information_schema.tables t USING (table_schema, table_name)
 WHERE c.table_schema = $1 AND t.table_type = 'BASE TABLE'`, db.Schema)
	if err != nil {
		t.Fatal(err)
	}
	actual := map[string]map[string]bool{}
	var table, column string
	if _, err := pgx.ForEachRow(rows, []any{&table, &column}, func() error {
		if actual[table] == nil {
			actual[table] = map[string]bool{}
		}
		actual[table][column] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("docs/tables.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]map[string]bool{}
	heading, row := regexp.MustCompile("^## ([a-z_]+)$"), regexp.MustCompile("^\\| `([a-z_]+)` \\|")
	table = ""
	for i, line := range strings.Split(string(b), "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			table = m[1]
			if documented[table] != nil {
				t.Errorf("docs/tables.md:%d: table %s twice", i+1, table)
			}
			documented[table] = map[string]bool{}
		} else if m := row.FindStringSubmatch(line); m != nil && table != "" {
			documented[table][m[1]] = true
		}
	}
	for table, cols := range actual {
		if documented[table] == nil {
			t.Errorf("docs/tables.md has no section for table %s", table)
			continue
		}
		for c := range cols {
			if !documented[table][c] {
				t.Errorf("docs/tables.md does not name column %s.%s", table, c)
			}
		}
	}
	for table, cols := range documented {
		for c := range cols {
			if !actual[table][c] {
				t.Errorf("docs/tables.md names %s.%s, which the migrations do not create", table, c)
			}
		}
	}
}
