// Command httpserver is a small HTTP tool server whose mutating endpoints are guarded by
// httpguard: agents call its tools with an Idempotency-Key, and retries never repeat an effect.
//
// Tools (POST, guarded; GET passes through):
//
//	POST /tools/create_ticket  {"title": "...", "body": "..."}  → 201 + Location /tickets/N
//	POST /tools/send_email     {"to": "...", "subject": "..."}  → 200
//	POST /tools/deploy         {"service": "...", "version": "..."} → 202 + Location /deploys/N
//	GET  /tickets/{id}, GET /deploys/{id}, GET /stats
//
// Callers authenticate with "Authorization: Bearer TOKEN"; -tokens maps tokens to principals
// (the scope of their keys). The ledger is the embedded badger store in -store. The server
// holds at most -max-conns connections and closes idle (-idle-timeout) and slow
// (-read-timeout, -header-timeout) ones.
//
//	go run ./examples/httpserver -addr 127.0.0.1:8080 -store /tmp/tf-httpserver
//	curl -i -X POST localhost:8080/tools/create_ticket -H 'Authorization: Bearer dev-token' \
//	  -H 'Idempotency-Key: "7b1c0d5e-1f0a-4c1e-9d55-0c2a1b3e4f50"' \
//	  -H 'Content-Type: application/json' -d '{"title":"disk full"}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/netutil"

	"github.com/toolfence/toolfence/httpguard"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "httpserver:", err)
		os.Exit(1)
	}
}

// run parses args, serves until ctx ends and returns the first error. It prints
// "listening on http://ADDR" once the listener is open.
func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("httpserver", flag.ContinueOnError)
	fs.SetOutput(out)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	store := fs.String("store", ".toolfence/httpserver", "badger ledger directory")
	tokens := fs.String("tokens", "dev-token=dev", "comma-separated TOKEN=PRINCIPAL pairs")
	maxConns := fs.Int("max-conns", 1024, "connections held open at once (more wait to be accepted)")
	idle := fs.Duration("idle-timeout", 60*time.Second, "close a keep-alive connection idle this long")
	read := fs.Duration("read-timeout", 30*time.Second, "time to read a request, headers and body")
	header := fs.Duration("header-timeout", 10*time.Second, "time to read a request's headers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *maxConns <= 0 || *idle <= 0 || *read <= 0 || *header <= 0 {
		return errors.New("-max-conns, -idle-timeout, -read-timeout and -header-timeout must be positive")
	}
	if *header > *read {
		return fmt.Errorf("-header-timeout %v exceeds -read-timeout %v", *header, *read)
	}
	principals, err := parseTokens(*tokens)
	if err != nil {
		return err
	}
	l, err := badger.Open(*store, badger.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{Namespace: "httpserver"})
	if err != nil {
		return err
	}
	h, err := newHandler(ic, principals)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// Timeouts for reading requests and idle connections, none for writing (it would cut a
	// long response stream), and at most maxConns connections at once.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: *header, ReadTimeout: *read, IdleTimeout: *idle}
	fmt.Fprintf(out, "listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(netutil.LimitListener(ln, *maxConns)) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// parseTokens parses "TOKEN=PRINCIPAL,..." into a map.
func parseTokens(s string) (map[string]string, error) {
	m := map[string]string{}
	for pair := range strings.SplitSeq(s, ",") {
		token, principal, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || token == "" || principal == "" {
			return nil, fmt.Errorf("-tokens: %q is not TOKEN=PRINCIPAL", pair)
		}
		m[token] = principal
	}
	return m, nil
}

// newHandler returns the tool server: its routes behind the Idempotency-Key guard, with
// principals taken from bearer tokens.
func newHandler(ic *interceptor.Interceptor, principals map[string]string) (http.Handler, error) {
	guard, err := httpguard.New(ic, httpguard.Options{
		Principal: func(r *http.Request) (string, error) {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok {
				return "", fmt.Errorf("%w: send Authorization: Bearer TOKEN", ledger.ErrUnauthorized)
			}
			p, ok := principals[token]
			if !ok {
				return "", fmt.Errorf("%w: unknown token", ledger.ErrUnauthorized)
			}
			return p, nil
		},
		Logger: slog.Default(),
	})
	if err != nil {
		return nil, err
	}
	return guard.Wrap(newTools().routes()), nil
}
