package toolfence_test

import (
	"go/ast"
	"go/token"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// sentinel is a package-level Err* variable of the module.
type sentinel struct {
	pkg, name, msg string
	at             token.Position
}

// sentinels returns every package-level variable named Err… that the module's non-test Go
// files initialise with errors.New or fmt.Errorf, with the message (the format, for
// fmt.Errorf) it is given.
func sentinels(t *testing.T) []sentinel {
	t.Helper()
	var out []sentinel
	testkit.EachSourceFile(t, ".", nil, func(_ string, fset *token.FileSet, f *ast.File) {
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Err") || i >= len(vs.Values) {
						continue
					}
					call, ok := vs.Values[i].(*ast.CallExpr)
					if !ok || len(call.Args) == 0 {
						continue
					}
					fn, ok := call.Fun.(*ast.SelectorExpr)
					if !ok {
						continue
					}
					if pkg, ok := fn.X.(*ast.Ident); !ok || !(pkg.Name == "errors" && fn.Sel.Name == "New" || pkg.Name == "fmt" && fn.Sel.Name == "Errorf") {
						continue
					}
					s := sentinel{pkg: f.Name.Name, name: name.Name, at: fset.Position(name.Pos())}
					lit, ok := call.Args[0].(*ast.BasicLit)
					if ok && lit.Kind == token.STRING {
						s.msg, _ = strconv.Unquote(lit.Value)
					}
					out = append(out, s)
				}
			}
		}
	})
	require.Greater(t, len(out), 40, "the walk found the module's sentinels")
	return out
}

// TestSentinelMessagesStartWithTheirPackage: the rule for every package-level Err…
// variable made with errors.New or fmt.Errorf is that its message is a string literal that
// starts with the name of its package (the name in its package clause, not its import
// path), a colon and a space: "badger: store is locked", "remote: busy: %w". So an error
// text says where it comes from, whichever package wraps it.
func TestSentinelMessagesStartWithTheirPackage(t *testing.T) {
	t.Parallel()
	for _, s := range sentinels(t) {
		assert.True(t, strings.HasPrefix(s.msg, s.pkg+": "), "%s: %s.%s = %q: its message must start with %q", s.at, s.pkg, s.name, s.msg, s.pkg+": ")
	}
}

// TestOneSentinelPerConcept: no two packages define a sentinel with the same text after
// their prefix ("invalid options", "closed", "unavailable"): one concept has one sentinel,
// owned by the lowest package that needs it, and the others wrap it or use it.
func TestOneSentinelPerConcept(t *testing.T) {
	t.Parallel()
	seen := map[string]sentinel{}
	for _, s := range sentinels(t) {
		text := strings.TrimPrefix(s.msg, s.pkg+": ")
		if prev, dup := seen[text]; dup {
			t.Errorf("%s.%s (%s) and %s.%s (%s) are both %q: keep one, in the lower package", prev.pkg, prev.name, prev.at, s.pkg, s.name, s.at, text)
			continue
		}
		seen[text] = s
	}
}
