package tools

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeProgram builds and runs the whole program of the top-level README's langchaingo
// section (the Go program that calls tools.Guard), as a new user who copies it would, and
// checks what it prints: one charge, then a replay.
func TestReadmeProgram(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	var blocks [][]byte
	for _, b := range regexp.MustCompile("(?s)```go\n(package main\n.*?)```").FindAllSubmatch(readme, -1) {
		if strings.Contains(string(b[1]), "tools.Guard(") {
			blocks = b
		}
	}
	require.NotNil(t, blocks, "README.md has no Go program (a block starting with package main) that calls tools.Guard")

	// The program must live inside the module to import it; a dot-directory is ignored by ./...
	dir, err := os.MkdirTemp("..", ".readme-program-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), blocks[1], 0o644))
	bin := filepath.Join(t.TempDir(), "readme-program")
	build := exec.Command("go", "build", "-o", bin, "./"+filepath.Base(dir))
	build.Dir = ".."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "the README program does not build:\n%s", out)

	run := exec.Command(bin)
	run.Dir = t.TempDir() // its ./.toolfence store is fresh
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, 3, "%s", out)
	require.Equal(t, `{"charge":"ch_1"}`, lines[0])
	require.True(t, strings.HasPrefix(lines[1], "[replayed] already done, outcome recorded at "), lines[1])
	require.True(t, strings.HasSuffix(lines[1], `{"charge":"ch_1"}`), lines[1])
	require.Equal(t, "charges: 1", lines[2])
}
