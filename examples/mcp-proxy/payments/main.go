// Command payments is an offline fake payments MCP server (official Go SDK, stdio) for the
// toolfence proxy example: charge {order_id, amount_cents} appends a line to a ledger file
// and fsyncs it before it answers with a charge id (every call is a new charge);
// find_charge {order_id} answers structuredContent {"found": bool, "charge_id": …} and
// list_charges lists them (both annotated read-only).
//
//	go run ./examples/mcp-proxy/payments --ledger /tmp/charges.jsonl
//
// The ledger file is --ledger, else $PAYMENTS_LEDGER, else payments-ledger.jsonl. The
// server's code is internal/payments (the evals and benchmarks use it too).
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/toolfence/toolfence/internal/payments"
)

func main() {
	ledger := flag.String("ledger", "", "ledger file (JSON lines, fsynced); default $PAYMENTS_LEDGER, else payments-ledger.jsonl")
	flag.Parse()
	path := cmp.Or(*ledger, os.Getenv("PAYMENTS_LEDGER"), "payments-ledger.jsonl")
	if err := payments.Serve(context.Background(), &payments.FileLedger{Path: path}); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}
