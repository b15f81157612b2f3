// Command payments is an offline fake payments MCP server (official Go SDK, stdio) for the
// toolfence proxy example: charge {order_id, amount_cents} appends a line to a ledger file
// and fsyncs it before it answers with a charge id (every call is a new charge);
// find_charge {order_id} answers structuredContent {"found": bool, "charge_id": …} and
// list_charges lists them (both annotated read-only).
//
//	go run ./examples/mcp-proxy/payments --ledger /tmp/charges.jsonl
//
// The ledger file is --ledger, else $PAYMENTS_LEDGER, else payments-ledger.jsonl. With
// --pause-after-charge it plays a slow payment API: once a charge is durable it does not
// answer until its client goes away (the example kills the agent meanwhile). The server's
// code is examples/payments (the evals and benchmarks use it too).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/toolfence/toolfence/examples/payments"
)

func main() {
	ledger := flag.String("ledger", "", "ledger file (JSON lines, fsynced); default $PAYMENTS_LEDGER, else payments-ledger.jsonl")
	pause := flag.Bool("pause-after-charge", false, "once a charge is durable, do not answer until the client goes away")
	flag.Parse()
	path := cmp.Or(*ledger, os.Getenv("PAYMENTS_LEDGER"), "payments-ledger.jsonl")
	var b payments.Backend = &payments.FileLedger{Path: path}
	if *pause {
		b = pausing{b}
	}
	// Once its client (the proxy) is gone, nothing can read an answer: exit, even with a
	// paused charge.
	go func(parent int) {
		for range time.Tick(100 * time.Millisecond) {
			if os.Getppid() != parent {
				os.Exit(0)
			}
		}
	}(os.Getppid())
	if err := payments.Serve(context.Background(), b); err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

// pausing charges, then holds the answer until the request is cancelled.
type pausing struct{ payments.Backend }

func (p pausing) Charge(ctx context.Context, orderID string, amountCents int64) (string, error) {
	id, err := p.Backend.Charge(ctx, orderID, amountCents)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "payments: charged %s for %s; pausing before the answer\n", id, orderID)
	<-ctx.Done()
	return "", ctx.Err()
}
