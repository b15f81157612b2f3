package remote_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/remote"
)

// blockingReserve holds every Reserve until release is closed, telling entered of each.
type blockingReserve struct {
	ledger.Ledger
	entered chan struct{}
	release chan struct{}
}

func (b *blockingReserve) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Ledger.Reserve(ctx, p)
}

// twoTokens authorizes "token-a…" and "token-b…" as two principals of namespace team.
func twoTokens(r *http.Request) (remote.Access, error) {
	tok := r.Header.Get("Authorization")
	return remote.Access{Namespace: "team", Principal: tok}, nil
}

// Past MaxInFlight steps of one principal, its next step gets 429 and ErrBusy (wrapping
// ledger.ErrUnavailable: it did not run), while another principal is served; past
// MaxInFlightTotal every principal is refused. Released slots come back.
func TestHandlerBoundsStepsInFlight(t *testing.T) {
	b := &blockingReserve{Ledger: openBadger(t, t.TempDir(), lease.NewFake(start)), entered: make(chan struct{}, 4), release: make(chan struct{})}
	endpoint := serve(t, remote.Handler(b, remote.HandlerOptions{Authorize: twoTokens, MaxInFlight: 1, MaxInFlightTotal: 2}), false)
	a := dial(t, endpoint, remote.Options{Token: "token-a-0123456789abcdef"})
	bb := dial(t, endpoint, remote.Options{Token: "token-b-0123456789abcdef"})
	c := dial(t, endpoint, remote.Options{Token: "token-c-0123456789abcdef"})
	ctx := t.Context()

	done := make(chan error, 2)
	go func() { _, err := a.Reserve(ctx, reserveParams("team", "x")); done <- err }()
	<-b.entered
	_, err := a.Get(ctx, ledger.GetParams{Namespace: "team", Key: reserveParams("team", "x").Key})
	require.ErrorIs(t, err, remote.ErrBusy, "token a has its one step in flight")
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	require.NotErrorIs(t, err, ledger.ErrOutcomeUnknown, "a refused step did not run")
	require.Contains(t, err.Error(), "this token has 1 requests in progress")

	go func() { _, err := bb.Reserve(ctx, reserveParams("team", "y")); done <- err }()
	<-b.entered
	_, err = c.Get(ctx, ledger.GetParams{Namespace: "team", Key: reserveParams("team", "y").Key})
	require.ErrorIs(t, err, remote.ErrBusy, "two steps in flight in all")
	require.Contains(t, err.Error(), "2 requests are in progress on this server")

	close(b.release)
	require.NoError(t, <-done)
	require.NoError(t, <-done)
	_, err = a.Reserve(ctx, reserveParams("team", "z"))
	require.NoError(t, err, "the slots came back")
}

// Past MaxWatches streams of one principal its next watch gets 429 and ErrBusy; another
// principal still watches; a closed stream gives its slot back.
func TestHandlerBoundsWatchStreams(t *testing.T) {
	l := openBadger(t, t.TempDir(), lease.NewFake(start))
	endpoint := serve(t, remote.Handler(l, remote.HandlerOptions{Authorize: twoTokens, MaxWatches: 1, MaxWatchesTotal: 2}), false)
	a := dial(t, endpoint, remote.Options{Token: "token-a-0123456789abcdef"})
	bb := dial(t, endpoint, remote.Options{Token: "token-b-0123456789abcdef"})
	c := dial(t, endpoint, remote.Options{Token: "token-c-0123456789abcdef"})

	wctx, stop := context.WithCancel(t.Context())
	ch, err := a.Watch(wctx, "team")
	require.NoError(t, err)
	_, err = a.Watch(t.Context(), "team")
	require.ErrorIs(t, err, remote.ErrBusy, "token a holds its one stream")
	require.Contains(t, err.Error(), "too many watch streams open")
	_, err = bb.Watch(t.Context(), "team")
	require.NoError(t, err, "token b has its own")
	_, err = c.Watch(t.Context(), "team")
	require.ErrorIs(t, err, remote.ErrBusy, "two streams in all")

	stop()
	for range ch {
	}
	require.Eventually(t, func() bool {
		_, err := a.Watch(t.Context(), "team")
		return err == nil
	}, 5e9, 1e7, "the closed stream's slot comes back once the server sees it end")
}
