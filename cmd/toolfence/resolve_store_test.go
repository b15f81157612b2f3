package main

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// TestLocalResolveStoresLikeEverySurface: `toolfence resolve --result` on a local store goes
// through the interceptor's one path to store a result, so a result over the cap is cut,
// marked truncated and keeps the digest of the whole (argv cannot carry one that large, so
// the records layer is driven directly).
func TestLocalResolveStoresLikeEverySurface(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var key string
	f.with(past(2*time.Hour), func(l ledger.Ledger) {
		key, _ = f.reserve(l, "default", "run-1", "email", "email:bob@example.com", time.Minute)
	})
	big := `{"log":"` + strings.Repeat("x", interceptor.DefaultMaxResult) + `"}`
	f.with(lease.Real{}, func(l ledger.Ledger) {
		r := &local{l: l, ns: "default", store: f.dir}
		got, err := r.resolve(t.Context(), ledger.ResolveParams{Key: key, As: residual.Succeeded, By: "alice", Note: "found it", Result: []byte(big)})
		require.NoError(t, err)
		require.True(t, got.ResultTruncated)
		require.Len(t, got.Result, interceptor.DefaultMaxResult)
		require.Equal(t, sha256hex(big), got.ResultDigest)
	})
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
