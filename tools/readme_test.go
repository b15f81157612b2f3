package tools

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeSnippet checks that the first Go block of tools/README.md is the body of
// ExampleGuard, which go test compiles and runs against its // Output.
func TestReadmeSnippet(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)```go\n// fragment[^\n]*\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, block, "README.md has no Go block")

	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	body := regexp.MustCompile(`(?s)func ExampleGuard\(\) \{\n(.*?)\t// Output:`).FindSubmatch(src)
	require.NotNil(t, body, "example_test.go has no ExampleGuard")
	var lines []string
	for _, l := range strings.Split(string(body[1]), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	require.Equal(t, strings.Join(lines, "\n"), string(block[1]), "README.md's snippet must be ExampleGuard's body")
}
