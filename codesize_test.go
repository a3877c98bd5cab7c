package millrace_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the longest a function of library code may be, from its
// func keyword to its closing brace.
const maxFuncLines = 100

// No function in library code is longer than maxFuncLines: a function that
// long does several things, and reads better as the steps it takes. Library
// code is every package but commands (cmd/, any package main), examples,
// the bench, and internal test helpers (internal packages whose name ends
// in "test"); test files do not count.
func TestNoLongFunctionsInLibraryCode(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			skip := path != "." && (strings.HasPrefix(name, ".") || name == "testdata" ||
				path == "cmd" || path == "examples" || path == "bench" ||
				strings.HasPrefix(path, "internal"+string(filepath.Separator)) && strings.HasSuffix(name, "test"))
			if skip {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Ext(path) != ".go" || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			name := filepath.ToSlash(path) + ": " + fn.Name.Name
			if lines > maxFuncLines {
				t.Errorf("%s is %d lines long, more than %d: split it into the steps it takes", name, lines, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
