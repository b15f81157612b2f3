package interceptor_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestViolationsAreBuiltHere: outside package interceptor no code builds an
// interceptor.Violation (a composite literal or new): every surface gets its violations,
// kind and recovery text included, from the interceptor, so no surface can drift from the
// barrier's answer. Tests may build them.
func TestViolationsAreBuiltHere(t *testing.T) {
	t.Parallel()
	const pkg = "github.com/toolfence/toolfence/interceptor"
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	self, err := filepath.Abs(".")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var found []string
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path == self || path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
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
		checked++
		name := ""
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == pkg {
				name = "interceptor"
				if imp.Name != nil {
					name = imp.Name.Name
				}
			}
		}
		if name == "" || name == "_" || name == "." {
			return nil
		}
		isViolation := func(e ast.Expr) bool {
			sel, ok := e.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Violation" {
				return false
			}
			id, ok := sel.X.(*ast.Ident)
			return ok && id.Name == name
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var at token.Pos
			switch n := n.(type) {
			case *ast.CompositeLit:
				if n.Type != nil && isViolation(n.Type) {
					at = n.Pos()
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "new" && len(n.Args) == 1 && isViolation(n.Args[0]) {
					at = n.Pos()
				}
			}
			if at.IsValid() {
				rel, _ := filepath.Rel(root, fset.Position(at).Filename)
				found = append(found, rel+":"+strconv.Itoa(fset.Position(at).Line))
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	require.Greater(t, checked, 50, "the walk must reach the module's packages")
	require.Empty(t, found, "only package interceptor builds an interceptor.Violation; get it from Commit, Report, Begin, Resume or Renew")
}
