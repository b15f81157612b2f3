//lint:file-ignore SA1019 these tests cover the legacy protocol paths (logging, GET streams, subscribe) on purpose

package mcpserver_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/mcpserver"
)

// notes collects a client's notifications.
type notes chan mcp.JSONRPCNotification

func collect(c *client.Client) notes {
	ch := make(notes, 256)
	c.OnNotification(func(n mcp.JSONRPCNotification) {
		select {
		case ch <- n:
		default:
		}
	})
	return ch
}

func uriOf(n mcp.JSONRPCNotification) string {
	u, _ := n.Params.AdditionalFields["uri"].(string)
	return u
}

// await waits (bounded, not a sleep) for a notification of method (and uri, if set) and
// returns the ones seen on the way.
func (ch notes) await(t *testing.T, method, uri string) []mcp.JSONRPCNotification {
	t.Helper()
	var seen []mcp.JSONRPCNotification
	deadline := time.After(15 * time.Second)
	for {
		select {
		case n := <-ch:
			seen = append(seen, n)
			if n.Method == method && (uri == "" || uriOf(n) == uri) {
				return seen
			}
		case <-deadline:
			t.Fatalf("no %s %s notification; saw %v", method, uri, describe(seen))
		}
	}
}

func describe(ns []mcp.JSONRPCNotification) []string {
	var out []string
	for _, n := range ns {
		out = append(out, fmt.Sprintf("%s %s", n.Method, uriOf(n)))
	}
	return out
}

func resourceURIs(t *testing.T, c *client.Client) []string {
	t.Helper()
	res, err := c.ListResources(ctx(t), mcp.ListResourcesRequest{})
	require.NoError(t, err)
	var uris []string
	for _, r := range res.Resources {
		uris = append(uris, r.URI)
	}
	return uris
}

// TestNotifications: ledger changes reach subscribed clients as resources/updated, and a
// residual opening or settling changes the resource list (list_changed), on each transport
// and protocol era; another namespace hears nothing of it.
func TestNotifications(t *testing.T) {
	t.Parallel()
	t.Run("http-session", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		sub := e.dial(tokA, legacy, transport.WithContinuousListening())
		got := collect(sub)
		require.NoError(t, sub.Subscribe(ctx(t), mcp.SubscribeRequest{Params: mcp.SubscribeParams{URI: mcpserver.PendingURI}}))
		other := e.dial(tokB, legacy, transport.WithContinuousListening())
		otherGot := collect(other)
		require.NoError(t, other.Subscribe(ctx(t), mcp.SubscribeRequest{Params: mcp.SubscribeParams{URI: mcpserver.PendingURI}}))

		w := e.dial(tokA, modern)
		b := ok[mcpserver.BeginResult](t, w, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
		got.await(t, mcp.MethodNotificationResourceUpdated, mcpserver.PendingURI)
		got.await(t, mcp.MethodNotificationResourcesListChanged, "")
		require.Contains(t, resourceURIs(t, sub), "toolfence://residuals/"+b.Key)

		// Per-residual subscriptions work too.
		require.NoError(t, sub.Subscribe(ctx(t), mcp.SubscribeRequest{Params: mcp.SubscribeParams{URI: "toolfence://residuals/" + b.Key}}))
		ok[mcpserver.CommitResult](t, w, "commit_call", m{"key": b.Key, "token": b.Token, "lease_secret": b.LeaseSecret, "outcome": "succeeded"})
		got.await(t, mcp.MethodNotificationResourceUpdated, "toolfence://residuals/"+b.Key)
		got.await(t, mcp.MethodNotificationResourcesListChanged, "")
		require.NotContains(t, resourceURIs(t, sub), "toolfence://residuals/"+b.Key, "a settled residual leaves the list")

		// Namespace B heard nothing of A: its first notifications are those of its own write.
		wb := e.dial(tokB, legacy)
		bb := ok[mcpserver.BeginResult](t, wb, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
		seen := otherGot.await(t, mcp.MethodNotificationResourcesListChanged, "")
		for _, n := range seen {
			require.NotEqual(t, "toolfence://residuals/"+b.Key, uriOf(n))
		}
		require.Len(t, slices.DeleteFunc(seen, func(n mcp.JSONRPCNotification) bool {
			return n.Method != mcp.MethodNotificationResourceUpdated
		}), 1, "exactly one update (B's own begin) reached B: %v", describe(seen))
		uris := resourceURIs(t, other)
		require.Contains(t, uris, "toolfence://residuals/"+bb.Key)
		require.NotContains(t, uris, "toolfence://residuals/"+b.Key)
	})
	t.Run("http/2026-07-28", func(t *testing.T) {
		t.Parallel()
		e := setup(t, nil)
		sub := e.dial(tokA, modern)
		got := collect(sub)
		stop, err := sub.ListenAsync(ctx(t), mcp.SubscriptionFilter{ResourcesListChanged: true, ResourceSubscriptions: []string{mcpserver.PendingURI}}, nil)
		require.NoError(t, err)
		t.Cleanup(stop)
		got.await(t, mcp.MethodNotificationSubscriptionsAcknowledged, "")

		w := e.dial(tokA, legacy)
		ok[mcpserver.BeginResult](t, w, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
		got.await(t, mcp.MethodNotificationResourceUpdated, mcpserver.PendingURI)
		got.await(t, mcp.MethodNotificationResourcesListChanged, "")
	})
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		c := dialStdio(t, t.TempDir(), "default", legacy)
		got := collect(c)
		require.NoError(t, c.Subscribe(ctx(t), mcp.SubscribeRequest{Params: mcp.SubscribeParams{URI: mcpserver.PendingURI}}))
		ok[mcpserver.BeginResult](t, c, "begin_call", m{"task": "t", "operation": "o", "target": "x", "args": m{}})
		got.await(t, mcp.MethodNotificationResourceUpdated, mcpserver.PendingURI)
		got.await(t, mcp.MethodNotificationResourcesListChanged, "")
	})
}
