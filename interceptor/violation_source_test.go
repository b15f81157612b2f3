package interceptor_test

import (
	"go/ast"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
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
	var found []string
	checked := testkit.EachSourceFile(t, root, []string{self}, func(_ string, fset *token.FileSet, f *ast.File) {
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
			return
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
	})
	require.Greater(t, checked, 50, "the walk must reach the module's packages")
	require.Empty(t, found, "only package interceptor builds an interceptor.Violation; get it from Commit, Report, Begin, Resume or Renew")
}
