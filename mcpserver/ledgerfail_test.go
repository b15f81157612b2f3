package mcpserver_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// brokenLedger fails reads with an error that names the database, as pgx's errors do.
type brokenLedger struct{ ledger.Ledger }

var errConn = errors.New(`failed to connect to host=db.internal port=5432 user=toolfence database=prod: search_path "ops"`)

func (brokenLedger) List(context.Context, ledger.ListParams) (*ledger.Page, error) {
	return nil, errConn
}
func (brokenLedger) Get(context.Context, ledger.GetParams) (*residual.Residual, error) {
	return nil, errConn
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLedgerFailureLoggedNotLeaked: when the ledger fails, the server logs the error and
// the client is told only that it failed and under which reference, never the database's
// host, port, user or schema.
func TestLedgerFailureLoggedNotLeaked(t *testing.T) {
	t.Parallel()
	led, err := badger.Open(t.TempDir(), badger.Options{Clock: lease.NewFake(t0)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, led.Close()) })
	ic, err := interceptor.New(brokenLedger{led}, interceptor.Options{Namespace: nsA, Clock: lease.NewFake(t0)})
	require.NoError(t, err)
	var log syncBuffer
	srv, err := mcpserver.New(ic, mcpserver.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.CloseClientConnections()
		ts.Close()
	})
	tr, err := transport.NewStreamableHTTP(ts.URL + mcpwire.Path)
	require.NoError(t, err)
	c := start(t, client.NewClient(tr, client.WithProtocolVersion(modern)), modern)
	for _, tc := range []struct {
		tool string
		args any
	}{
		{mcpserver.ToolListPending, m{}},
		{mcpserver.ToolInspect, m{"key": "tf1_" + strings.Repeat("a", 64)}},
	} {
		e := fails(t, c, tc.tool, tc.args)
		require.Equal(t, mcpwire.KindUnavailable, e.Kind)
		require.Contains(t, e.Message, "the server's log has the details")
		for _, secret := range []string{"db.internal", "5432", "user=", "prod", "search_path"} {
			require.NotContains(t, e.Message, secret, tc.tool)
		}
		ref := e.Message[strings.Index(e.Message, "ref ")+4:][:8]
		require.Contains(t, log.String(), "ref="+ref, "the log line carries the reference")
	}
	require.Contains(t, log.String(), "db.internal", "the server's log has the details")
}
