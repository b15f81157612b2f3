// Command mcpfixture runs an upstream MCP server of package mcpfixture, configured by the
// MCPFX_* environment (see package mcpfixture):
//
//	mcpfixture gosdk|mcpgo             over stdio
//	mcpfixture gosdk|mcpgo ADDR        over streamable HTTP at http://ADDR/mcp; it prints
//	                                   "mcpfixture: serving http://HOST:PORT/mcp" on stdout
//
// It exits 0 when the stdio client hangs up, 1 on a transport error, 2 on bad arguments.
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/toolfence/toolfence/internal/mcpfixture"
)

func main() {
	stdio := map[string]func(context.Context) error{"gosdk": mcpfixture.RunGoSDK, "mcpgo": mcpfixture.RunMCPGo}
	handlers := map[string]func() http.Handler{"gosdk": mcpfixture.GoSDKHandler, "mcpgo": mcpfixture.MCPGoHandler}
	if len(os.Args) < 2 || len(os.Args) > 3 || stdio[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: mcpfixture gosdk|mcpgo [ADDR]")
		os.Exit(2)
	}
	var err error
	if len(os.Args) == 2 {
		err = stdio[os.Args[1]](context.Background())
	} else {
		err = serveHTTP(os.Args[2], handlers[os.Args[1]]())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpfixture:", err)
		os.Exit(1)
	}
}

func serveHTTP(addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	fmt.Printf("mcpfixture: serving http://%s/mcp\n", ln.Addr())
	return http.Serve(ln, mux)
}
