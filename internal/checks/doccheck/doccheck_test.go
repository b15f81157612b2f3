package doccheck

import (
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// root is the module's root directory.
const root = "../../.."

// markdown returns the Markdown files of the repository (not in dot-directories or testdata).
func markdown(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	require.NoError(t, err)
	require.Contains(t, files, filepath.Join(root, "README.md"))
	require.Contains(t, files, filepath.Join(root, "tools", "README.md"))
	return files
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```")

// TestGoBlocksAreProgramsOrFragments: every ```go block of the repository's Markdown is a
// whole program (it starts with "package main"), which this test builds and runs, or says
// on its first line that it is a fragment ("// fragment…"), so nobody copies a snippet that
// cannot compile believing it complete.
func TestGoBlocksAreProgramsOrFragments(t *testing.T) {
	t.Parallel()
	var programs []string
	var names []string
	for _, path := range markdown(t) {
		for i, m := range goBlock.FindAllStringSubmatch(read(t, path), -1) {
			first, _, _ := strings.Cut(m[1], "\n")
			name := filepath.ToSlash(strings.TrimPrefix(path, root+"/")) + " block " + string(rune('1'+i))
			switch {
			case first == "package main":
				programs = append(programs, m[1])
				names = append(names, name)
			case strings.HasPrefix(first, "// fragment"):
			default:
				t.Errorf("%s starts with %q: a Go block is a whole program (package main) or starts with a // fragment comment", name, first)
			}
		}
	}
	require.GreaterOrEqual(t, len(programs), 2, "README.md has two whole programs")

	// A program must live inside the module to import it; a dot-directory is outside ./... .
	dir, err := os.MkdirTemp(root, ".doccheck-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for i, src := range programs {
		pkg := filepath.Join(dir, "p"+string(rune('a'+i)))
		require.NoError(t, os.MkdirAll(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(src), 0o644))
		bin := filepath.Join(t.TempDir(), "program")
		build := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(dir)+"/"+filepath.Base(pkg))
		build.Dir = root
		out, err := build.CombinedOutput()
		require.NoError(t, err, "%s does not build:\n%s", names[i], out)

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		run := exec.CommandContext(ctx, bin)
		run.Dir = t.TempDir()
		out, err = run.CombinedOutput()
		cancel()
		require.NoError(t, err, "%s does not run:\n%s", names[i], out)
	}
}

// internalDocs matches references to documents only toolfence's authors have (the design
// contract users have is docs/design.md, lower case; DESIGN.md and STYLE.md are the authors').
var internalDocs = regexp.MustCompile(`(?i:\bseeds?[ -]?0\d\d\b|seeds/)|\bDESIGN\.md\b|\bSTYLE\.md\b`)

// TestDocsReferOnlyToDocumentsUsersHave: the Markdown a user reads names no internal
// document; it says what a pattern is instead.
func TestDocsReferOnlyToDocumentsUsersHave(t *testing.T) {
	t.Parallel()
	for _, path := range markdown(t) {
		for i, line := range strings.Split(read(t, path), "\n") {
			if m := internalDocs.FindString(line); m != "" {
				t.Errorf("%s:%d refers to %q, a document users do not have: %s", path, i+1, m, line)
			}
		}
	}
}

// TestReadmeSaysWhatANewcomerNeeds: the README says how to install the binary and see its
// version, gives the two commands, names every service the tests need with its address
// variable and skip switch and links docs/testing.md, and links the evals; docs/testing.md
// has the whole table of services (and .ci/run starts each).
func TestReadmeSaysWhatANewcomerNeeds(t *testing.T) {
	t.Parallel()
	readme := read(t, filepath.Join(root, "README.md"))
	testingMD := read(t, filepath.Join(root, "docs", "testing.md"))
	ci := read(t, filepath.Join(root, ".ci", "run"))
	for _, want := range []string{
		"go install github.com/toolfence/toolfence/cmd/toolfence@latest", "make build", "./bin/toolfence", "toolfence --version",
		"PATH", "[docs/evals.md](docs/evals.md)", "toolfence eval", "make demo", "make test",
		"PostgreSQL", "TOOLFENCE_TEST_PG", "TOOLFENCE_SKIP_PG=1",
		"NATS", "JetStream", "NATS_URL", "TOOLFENCE_SKIP_NATS=1", "examples/consumer", ".ci/run", "CI=true",
		"[docs/testing.md](docs/testing.md)",
	} {
		require.Contains(t, readme, want)
	}
	for _, want := range []string{
		"PostgreSQL", "TOOLFENCE_TEST_PG", "TOOLFENCE_SKIP_PG=1", "pg_ctlcluster",
		"NATS", "JetStream", "NATS_URL", "TOOLFENCE_SKIP_NATS=1", "examples/consumer",
		"node and npm", "promtool", "fusermount3", "/dev/fuse", ".ci/run", "CI=true",
	} {
		require.Contains(t, testingMD, want, "docs/testing.md names every service")
	}
	for _, want := range []string{"pg_isready", "pg_ctlcluster", "nats-server", "-js", "TOOLFENCE_SKIP_NATS", "nodejs", "promtool", "fusermount3"} {
		require.Contains(t, ci, want, ".ci/run starts every service")
	}
	// Every skip switch a test reads is documented, on the front page and with its service.
	skip := regexp.MustCompile(`TOOLFENCE_SKIP_[A-Z]+`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return err
		}
		for _, name := range skip.FindAllString(read(t, path), -1) {
			require.Contains(t, readme, name, "%s reads %s", path, name)
			require.Contains(t, testingMD, name, "%s reads %s", path, name)
		}
		return nil
	})
	require.NoError(t, err)
}
