package toolfence_test

import (
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// module is the module path; packages are named below by their path relative to it.
const module = "github.com/toolfence/toolfence"

// allowed is the import table: for every package of the module, the packages of the module
// its non-test files may import. A package missing from the table fails the test, so a new
// package is placed in the layering when it is added. The layers, from the bottom:
//
//	residual                        the record, pure
//	lease, jsonptr                  leases and clocks; JSON pointers and targets
//	ledger                          the contract
//	ledger/rules, ledger/*          the shared rules and the backends
//	interceptor                     the barrier, violations, recovery and observation texts
//	mcpwire                         the wire vocabulary of both MCP surfaces
//	tools, httpguard, consumer,     the adapters: each imports the layers below, never
//	mcpserver, mcpproxy             another adapter (TestAdaptersImportNoAdapter)
//	cmd/toolfence, evals, examples  the wiring
var allowed = map[string][]string{
	"residual": {},
	"lease":    {"residual"},
	"jsonptr":  {"residual"},
	"ledger":   {"lease", "residual"},

	"ledger/rules":      {"lease", "ledger", "residual"},
	"ledger/badger":     {"lease", "ledger", "ledger/rules", "residual"},
	"ledger/postgres":   {"lease", "ledger", "ledger/rules", "residual"},
	"ledger/ledgertest": {"lease", "ledger", "ledger/rules", "residual"},
	"ledger/remote":     {"internal/httpserve", "lease", "ledger", "residual"},

	"interceptor": {"lease", "ledger", "residual"},
	"mcpwire":     {"interceptor", "residual"},

	"tools":     {"interceptor", "jsonptr", "ledger", "residual"},
	"httpguard": {"interceptor", "ledger", "residual"},
	"consumer":  {"interceptor"},
	"mcpserver": {"interceptor", "internal/httpserve", "internal/mcptrace", "lease", "ledger", "mcpwire", "residual"},
	"mcpproxy":  {"interceptor", "internal/httpserve", "internal/mcptrace", "jsonptr", "lease", "ledger", "mcpproxy/policy", "mcpproxy/transport", "mcpwire", "residual"},
	// The proxy's pure policy language (interceptor only for ErrInvalidOptions) and its
	// transports, which import nothing of the module.
	"mcpproxy/policy":    {"interceptor", "jsonptr", "residual"},
	"mcpproxy/transport": {},

	"mcpproxy/interop":   {},
	"docs/observability": {},
	"evals/baselines":    {},
	"evals":              {"evals/baselines", "interceptor", "examples/payments", "ledger", "ledger/badger", "ledger/postgres", "mcpwire", "residual"},
	"cmd/toolfence": {"evals", "interceptor", "cmd/toolfence/internal/demo", "internal/httpserve", "evals/jepsen", "lease", "ledger",
		"ledger/badger", "ledger/postgres", "ledger/remote", "mcpproxy", "mcpproxy/policy", "mcpproxy/transport", "mcpserver", "mcpwire", "residual"},

	"examples/agents":             {},
	"examples/agents/email":       {"interceptor", "examples/scripted", "ledger/badger", "tools"},
	"examples/agents/payments":    {"httpguard", "interceptor", "examples/scripted", "ledger", "ledger/badger", "residual", "tools"},
	"examples/agents/webhooks":    {"interceptor", "examples/scripted", "ledger/badger", "residual", "tools"},
	"examples/consumer":           {"consumer", "interceptor", "ledger/badger"},
	"examples/httpserver":         {"httpguard", "interceptor", "ledger", "ledger/badger"},
	"examples/mcp-proxy":          {"examples/payments", "examples/scripted"},
	"examples/mcp-proxy/payments": {"examples/payments"},

	"internal/checks/benchcheck":                 {},
	"internal/testkit/crashtest":                 {},
	"cmd/toolfence/internal/demo":                {"httpguard", "interceptor", "examples/scripted", "ledger", "ledger/badger", "ledger/postgres", "residual", "tools"},
	"internal/checks/doccheck":                   {},
	"evals/faultproxy":                           {},
	"internal/httpserve":                         {},
	"evals/jepsen":                               {"evals/faultproxy", "evals/lazyfs", "internal/fixture/pgcluster", "lease", "ledger", "ledger/badger", "ledger/postgres", "residual"},
	"evals/lazyfs":                               {},
	"internal/fixture/mcpfixture":                {},
	"internal/fixture/mcpfixture/cmd/mcpfixture": {"internal/fixture/mcpfixture"},
	"internal/mcptrace":                          {},
	"internal/testkit":                           {},
	"internal/testkit/npmci":                     {},
	"internal/testkit/proxyrun":                  {"interceptor", "internal/testkit", "ledger/badger", "mcpproxy", "mcpproxy/transport"},
	"examples/payments":                          {},
	"internal/fixture/pgcluster":                 {},
	"internal/checks/proxybench":                 {},
	"internal/checks/conformance":                {},
	"examples/scripted":                          {},
}

// adapters are the packages that put the barrier behind one surface; none imports another.
var adapters = []string{"tools", "httpguard", "consumer", "mcpserver", "mcpproxy"}

// core are the packages below the adapters, lowest first: each may import only packages
// listed before it.
var core = []string{"residual", "lease", "jsonptr", "ledger", "ledger/rules", "ledger/badger", "ledger/postgres",
	"ledger/remote", "ledger/ledgertest", "interceptor", "mcpwire"}

// pkg is one package of the module as its non-test files build.
type pkg struct {
	dir string
	// imports are the module packages imported by the package's non-test files.
	imports []string
	// doc is the package's doc comment.
	doc string
}

// packages returns the module's packages by their path relative to the module, read with
// go/build from the module's directory tree (dot-directories, testdata and node_modules
// skipped). A directory with only test files (the module's root) is not a package here.
func packages(t *testing.T) map[string]pkg {
	t.Helper()
	out := map[string]pkg{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		bp, err := build.ImportDir(path, 0)
		if _, none := err.(*build.NoGoError); none {
			return nil
		}
		require.NoError(t, err, path)
		if len(bp.GoFiles) == 0 {
			return nil // tests only, like this one
		}
		p := pkg{dir: path}
		for _, imp := range bp.Imports {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				p.imports = append(p.imports, rel)
			}
		}
		p.doc = packageDoc(t, path, bp.GoFiles)
		out[filepath.ToSlash(path)] = p
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, out, "interceptor", "run from the module's root")
	return out
}

// packageDoc returns the doc comment of the package made of files in dir.
func packageDoc(t *testing.T, dir string, files []string) string {
	t.Helper()
	fset := token.NewFileSet()
	var text []string
	for _, f := range files {
		af, err := parser.ParseFile(fset, filepath.Join(dir, f), nil, parser.ParseComments|parser.PackageClauseOnly)
		require.NoError(t, err)
		if af.Doc != nil {
			text = append(text, af.Doc.Text())
		}
	}
	return strings.Join(text, "\n")
}

// TestImportTable holds every package of the module to its row of the import table.
func TestImportTable(t *testing.T) {
	t.Parallel()
	pkgs := packages(t)
	for name, p := range pkgs {
		may, ok := allowed[name]
		if !assert.True(t, ok, "package %s is not in the import table (imports_test.go): place it in the layering", name) {
			continue
		}
		for _, imp := range p.imports {
			assert.Contains(t, may, imp, "%s may not import %s (imports_test.go's table)", name, imp)
		}
	}
	for name := range allowed {
		require.Contains(t, pkgs, name, "the import table names %s, which is no package: remove its row", name)
	}
}

// TestAdaptersImportNoAdapter: no adapter imports another, and no core package imports one
// above it.
func TestAdaptersImportNoAdapter(t *testing.T) {
	t.Parallel()
	pkgs := packages(t)
	for _, a := range adapters {
		for _, imp := range pkgs[a].imports {
			assert.NotContains(t, adapters, imp, "adapter %s imports adapter %s: move what they share down a layer", a, imp)
		}
	}
	for i, c := range core {
		for _, imp := range pkgs[c].imports {
			if strings.HasPrefix(imp, "internal/") {
				continue
			}
			assert.Contains(t, core[:i], imp, "core package %s imports %s, which is not below it", c, imp)
		}
	}
}

// TestProxyHasNoOtherSDK: the proxy and its packages build without langchaingo and mcp-go,
// whatever they import indirectly (go list -deps: go test puts its go command first in PATH).
func TestProxyHasNoOtherSDK(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "./mcpproxy/...").CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, module+"/mcpproxy")
	for _, d := range deps {
		for _, sdk := range []string{"github.com/tmc/langchaingo", "github.com/mark3labs/mcp-go"} {
			require.False(t, d == sdk || strings.HasPrefix(d, sdk+"/"), "mcpproxy depends on %s", d)
		}
	}
}

// clauseEnd ends the clause of a doc's import claim: a ';', or a '.' ending a sentence.
var clauseEnd = regexp.MustCompile(`;|\.( |$)`)

// word is a package path as a doc comment writes it.
var word = regexp.MustCompile(`[a-z][a-z0-9_/-]*[a-z0-9]`)

// TestDocImportClaimsAreTrue: a package doc that says what the package imports says it
// truly. The rule: the clause from "It imports" to the first ';' or the end of its sentence names
// every package of the module the package imports, by its path relative to the module
// ("ledger/badger", "internal/mcptrace"), and no other package of the module; anything
// else it names (the standard library, third-party modules) is not checked.
func TestDocImportClaimsAreTrue(t *testing.T) {
	t.Parallel()
	pkgs := packages(t)
	checked := 0
	for name, p := range pkgs {
		flat := strings.Join(strings.Fields(p.doc), " ")
		_, clause, ok := strings.Cut(flat, "It imports ")
		if !ok {
			continue
		}
		if loc := clauseEnd.FindStringIndex(clause); loc != nil {
			clause = clause[:loc[0]]
		}
		var named []string
		for _, w := range word.FindAllString(clause, -1) {
			if _, pkg := pkgs[w]; pkg && !slices.Contains(named, w) {
				named = append(named, w)
			}
		}
		slices.Sort(named)
		imports := slices.Sorted(slices.Values(p.imports))
		assert.Equal(t, imports, named, "the doc of %s says %q; it imports %v of the module", name, "It imports "+clause, imports)
		checked++
	}
	require.Greater(t, checked, 10, "the package docs state their imports")
}
