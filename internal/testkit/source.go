package testkit

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// EachSourceFile parses every non-test Go file below root (the module's root, as an
// absolute or relative path) and calls fn with its path, the file set and the file.
// Directories whose names start with "." or "_", testdata, vendor and node_modules are
// skipped; so is each directory in skip. It fails the test on a walk or parse error, and
// returns how many files it parsed.
func EachSourceFile(tb testing.TB, root string, skip []string, fn func(path string, fset *token.FileSet, f *ast.File)) int {
	tb.Helper()
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "testdata" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			for _, s := range skip {
				if filepath.Clean(s) == filepath.Clean(path) {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		n++
		fn(path, fset, f)
		return nil
	})
	if err != nil {
		tb.Fatalf("walk %s: %v", root, err)
	}
	return n
}
