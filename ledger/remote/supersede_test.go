package remote_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
	"github.com/toolfence/toolfence/residual"
)

// reserveBodies records the bodies of the reserve requests that pass through it.
type reserveBodies struct {
	inner http.Handler
	mu    sync.Mutex
	seen  []string
}

func (rb *reserveBodies) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/reserve") {
		body, _ := io.ReadAll(r.Body)
		rb.mu.Lock()
		rb.seen = append(rb.seen, string(body))
		rb.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	rb.inner.ServeHTTP(w, r)
}

func (rb *reserveBodies) last() string {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.seen[len(rb.seen)-1]
}

// Supersede travels as "Supersede" (omitted when zero, so a reserve without it is what an
// older server accepts) and a request bound to a namespace keeps it: a new intent over a
// success is a new attempt like a new task's, under the proof of the client that made it.
// Another client superseding the same success at once gets the key in progress, and a
// stale token is answered with the replay.
func TestBoundSupersedeTravelsAndIsFenced(t *testing.T) {
	b := openBadger(t, t.TempDir(), lease.NewFake(start))
	rec := &reserveBodies{inner: remote.Handler(b, remote.HandlerOptions{Authorize: boundTo("team")})}
	endpoint := serve(t, rec, false)
	first := dial(t, endpoint, remote.Options{Token: token})
	second := dial(t, endpoint, remote.Options{Token: token})
	ctx := t.Context()

	p := reserveParams("team", "file:/tmp/a")
	res, err := first.Reserve(ctx, p)
	require.NoError(t, err)
	require.NotContains(t, rec.last(), "Supersede", "zero is omitted from the wire")
	done, err := first.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: p.Holder, Token: res.Lease.Token, Outcome: residual.Succeeded, Result: []byte(`1`)})
	require.NoError(t, err)

	sup := p
	sup.Supersede = done.Token
	again, err := first.Reserve(ctx, sup)
	require.NoError(t, err)
	require.Contains(t, rec.last(), fmt.Sprintf(`"Supersede":%d`, done.Token))
	require.Equal(t, ledger.Acquired, again.Decision)
	require.Greater(t, again.Lease.Token, done.Token)
	require.Equal(t, p.Holder, again.Lease.Holder, "the client's caller sees its holder as it named it")
	stored, err := b.Get(ctx, ledger.GetParams{Namespace: "team", Key: p.Key})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(stored.Current().Holder, p.Holder+"@"), "qualified by the proof: %s", stored.Current().Holder)

	racer, err := second.Reserve(ctx, sup)
	require.NoError(t, err)
	require.Equal(t, ledger.InProgress, racer.Decision, "one success is superseded once")
	_, err = second.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: p.Holder, Token: again.Lease.Token, Outcome: residual.Succeeded})
	require.ErrorIs(t, err, residual.ErrLeaseLost, "only the superseding client holds the new attempt")

	_, err = first.Commit(ctx, ledger.CommitParams{Namespace: "team", Key: p.Key, Holder: p.Holder, Token: again.Lease.Token, Outcome: residual.Succeeded, Result: []byte(`2`)})
	require.NoError(t, err)
	stale, err := second.Reserve(ctx, sup)
	require.NoError(t, err)
	require.Equal(t, ledger.Replay, stale.Decision, "a stale supersede replays")
	require.Equal(t, `2`, string(stale.Residual.Result))
}
