package millrace_test

import (
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
