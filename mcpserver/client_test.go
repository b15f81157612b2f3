package mcpserver_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/mcpserver"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// TestClient: what the CLI's --server flag uses: List, Inspect and Resolve through the
// server, with tool errors matching residual's sentinels.
func TestClient(t *testing.T) {
	t.Parallel()
	e := setup(t, nil)
	agent := e.dial(tokA, legacy)
	b := ok[mcpserver.BeginResult](t, agent, "begin_call", m{"task": "job-1", "operation": "charge", "target": "inv:9", "args": m{"n": 9}, "lease_ms": 1000})
	ok[mcpserver.CommitResult](t, agent, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "unknown", "error": "connection reset"})

	c, err := mcpserver.Dial(ctx(t), e.ts.URL+"/", tokA)
	require.NoError(t, err)
	defer c.Close()
	page, err := c.List(ctx(t), mcpserver.ListPendingInput{Task: "job-1"})
	require.NoError(t, err)
	require.Len(t, page.Residuals, 1)
	require.Equal(t, residual.Unknown, page.Residuals[0].State)

	v, err := c.Inspect(ctx(t), b.Key)
	require.NoError(t, err)
	require.Equal(t, "connection reset", v.Attempts[0].Error)
	require.Equal(t, nsA, v.Namespace)

	_, err = c.Inspect(ctx(t), residual.Key(nsA, "x", "y", "z"))
	require.ErrorIs(t, err, residual.ErrNotFound)
	var te *mcpserver.ToolError
	require.True(t, errors.As(err, &te))
	require.Equal(t, mcpwire.KindNotFound, te.Info.Kind)
	_, err = c.Inspect(ctx(t), "bogus")
	require.ErrorIs(t, err, interceptor.ErrInvalidCall)

	rs, err := c.Resolve(ctx(t), mcpserver.ResolveInput{Key: b.Key, As: "failed", Note: "the card network has no such charge", By: "ops@example.com"})
	require.NoError(t, err)
	require.Equal(t, residual.Failed, rs.State)
	_, err = c.Resolve(ctx(t), mcpserver.ResolveInput{Key: b.Key, As: "succeeded", Note: "again"})
	require.ErrorIs(t, err, residual.ErrInvalidTransition)
	v, err = c.Inspect(ctx(t), b.Key)
	require.NoError(t, err)
	require.Equal(t, "ops@example.com", v.Resolutions[0].By)

	// The pending residual of a live lease cannot be resolved.
	b2 := ok[mcpserver.BeginResult](t, agent, "begin_call", m{"task": "job-1", "operation": "charge", "target": "inv:10", "args": m{}})
	_, err = c.Resolve(ctx(t), mcpserver.ResolveInput{Key: b2.Key, As: "failed", Note: "n"})
	require.ErrorIs(t, err, residual.ErrInProgress)

	_, err = mcpserver.Dial(ctx(t), "ftp://x", tokA)
	require.Error(t, err)
}

func TestNewAndClose(t *testing.T) {
	t.Parallel()
	_, err := mcpserver.New(nil, mcpserver.Options{})
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions)

	led, err := badger.Open(t.TempDir(), badger.Options{})
	require.NoError(t, err)
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Options{})
	require.NoError(t, err)
	for name, o := range map[string]mcpserver.Options{
		"max below default":  {MaxLease: time.Second},
		"negative field cap": {MaxField: -1},
		"bad operation":      {Operations: map[string]interceptor.Operation{"": {}}},
	} {
		_, err := mcpserver.New(ic, o)
		require.ErrorIs(t, err, interceptor.ErrInvalidOptions, name)
	}

	s, err := mcpserver.New(ic, mcpserver.Options{NewInterceptor: func(ns string) (*interceptor.Interceptor, error) {
		return interceptor.New(led, interceptor.Options{Namespace: "not-" + ns})
	}})
	require.NoError(t, err)
	require.Equal(t, interceptor.DefaultNamespace, s.Namespace())
	_, err = s.MCPServer("default")
	require.NoError(t, err)
	_, err = s.MCPServer("other")
	require.ErrorIs(t, err, interceptor.ErrInvalidOptions, "an interceptor of the wrong namespace is refused")
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")
	_, err = s.MCPServer("default")
	require.ErrorIs(t, err, lease.ErrClosed)
	require.ErrorIs(t, s.ServeStdio(context.Background(), "", nil, nil), lease.ErrClosed)
}
