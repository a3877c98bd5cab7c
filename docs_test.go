package millrace_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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
