// Command mcpfixture runs an upstream MCP server of package mcpfixture over stdio:
// `mcpfixture gosdk` (official Go SDK) or `mcpfixture mcpgo` (mcp-go), configured by the
// MCPFX_* environment (see package mcpfixture). It exits 0 when the client hangs up, 1 on a
// transport error, 2 on a bad argument.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/toolfence/toolfence/internal/mcpfixture"
)

func main() {
	run := map[string]func(context.Context) error{"gosdk": mcpfixture.RunGoSDK, "mcpgo": mcpfixture.RunMCPGo}
	if len(os.Args) != 2 || run[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: mcpfixture gosdk|mcpgo")
		os.Exit(2)
	}
	if err := run[os.Args[1]](context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "mcpfixture:", err)
		os.Exit(1)
	}
}
