package interceptor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
)

// Settings every test uses unless it says otherwise.
const (
	testTTL    = 10 * time.Second
	testMargin = 50 * time.Millisecond
	testTask   = "run-42"
	holderA    = "agent-a"
	holderB    = "agent-b"
)

var epoch = time.Date(2025, 3, 14, 9, 26, 53, 0, time.UTC)

// fixture is one test's world: a fake clock driving both the interceptor and a real badger
// ledger in a temp dir, an interceptor for holder A and a context carrying the task.
type fixture struct {
	t     *testing.T
	clock *lease.Fake
	// store is the real badger ledger; ledger is what the interceptor writes to (store, or
	// a wrapper around it).
	store  ledger.Ledger
	ledger ledger.Ledger
	ic     *interceptor.Interceptor
	ctx    context.Context
}

// option adjusts a fixture before its interceptor is built.
type option func(*setupOpts)

type setupOpts struct {
	cfg  interceptor.Options
	wrap func(ledger.Ledger) ledger.Ledger
}

func withConfig(f func(*interceptor.Options)) option {
	return func(o *setupOpts) { f(&o.cfg) }
}

func withLedger(wrap func(ledger.Ledger) ledger.Ledger) option {
	return func(o *setupOpts) { o.wrap = wrap }
}

func setup(t *testing.T, opts ...option) *fixture {
	t.Helper()
	clock := lease.NewFake(epoch)
	store := openBadger(t, clock)
	o := setupOpts{cfg: interceptor.Options{
		Holder: holderA, LeaseTTL: testTTL, Margin: testMargin, Clock: clock,
	}}
	for _, opt := range opts {
		opt(&o)
	}
	l := store
	if o.wrap != nil {
		l = o.wrap(store)
	}
	ic, err := interceptor.New(l, o.cfg)
	require.NoError(t, err)
	return &fixture{
		t: t, clock: clock, store: store, ledger: l, ic: ic,
		ctx: interceptor.WithTask(t.Context(), testTask),
	}
}

// openBadger opens a real badger ledger in a temp dir on clock; it is closed at cleanup.
func openBadger(t testing.TB, clock lease.Clock) ledger.Ledger {
	t.Helper()
	l, err := badger.Open(t.TempDir(), badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// successor returns a second interceptor on the same store, as another agent (holder B).
func (f *fixture) successor(mod ...func(*interceptor.Options)) *interceptor.Interceptor {
	f.t.Helper()
	cfg := interceptor.Options{Holder: holderB, LeaseTTL: testTTL, Margin: testMargin, Clock: f.clock}
	for _, m := range mod {
		m(&cfg)
	}
	ic, err := interceptor.New(f.store, cfg)
	require.NoError(f.t, err)
	return ic
}

func (f *fixture) key(operation, target string) string {
	return f.ic.Key(testTask, operation, target)
}

// get reads the residual of key from the store and requires that it exists.
func (f *fixture) get(key string) *residual.Residual {
	f.t.Helper()
	r, err := f.store.Get(context.Background(), ledger.GetParams{Namespace: f.ic.Namespace(), Key: key})
	require.NoError(f.t, err, "get %s", key)
	return r
}

// list returns every residual of the interceptor's namespace.
func (f *fixture) list() []*residual.Residual {
	f.t.Helper()
	var out []*residual.Residual
	p := ledger.ListParams{Namespace: f.ic.Namespace()}
	for range 100 {
		page, err := f.store.List(context.Background(), p)
		require.NoError(f.t, err)
		out = append(out, page.Residuals...)
		if page.NextCursor == "" {
			return out
		}
		p.Cursor = page.NextCursor
	}
	f.t.Fatal("list did not end")
	return nil
}

// charge is the call most tests make.
func charge(args string) interceptor.Call {
	return interceptor.Call{Operation: "payments.charge", Target: "invoice:INV-42", Args: json.RawMessage(args)}
}

const chargeArgs = `{"amount":1200,"currency":"eur"}`

// tool is a scripted ToolFunc that counts its invocations and records what it was given.
type tool struct {
	calls atomic.Int32
	mu    sync.Mutex
	seen  []interceptor.Dispatch
	run   func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error)
}

func newTool(run func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error)) *tool {
	return &tool{run: run}
}

// answering returns a tool that always answers resp, err.
func answering(resp interceptor.Response, err error) *tool {
	return newTool(func(context.Context, interceptor.Dispatch) (interceptor.Response, error) { return resp, err })
}

func (tl *tool) fn(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
	tl.calls.Add(1)
	tl.mu.Lock()
	tl.seen = append(tl.seen, d)
	tl.mu.Unlock()
	return tl.run(ctx, d)
}

func (tl *tool) count() int { return int(tl.calls.Load()) }

func (tl *tool) dispatches() []interceptor.Dispatch {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]interceptor.Dispatch(nil), tl.seen...)
}

func ok(body string) interceptor.Response {
	return interceptor.Response{Status: 200, Body: []byte(body)}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// sentinels is the residual sentinel each violation kind must wrap (from docs/design.md and the
// residual package, not from the interceptor's own table).
var sentinels = map[interceptor.Kind]error{
	interceptor.InProgress:       residual.ErrInProgress,
	interceptor.UnknownOutcome:   residual.ErrUnknownOutcome,
	interceptor.AwaitingUpstream: residual.ErrAwaitingUpstream,
	interceptor.PayloadMismatch:  residual.ErrPayloadMismatch,
	interceptor.LeaseLost:        residual.ErrLeaseLost,
	interceptor.MarginTooSmall:   residual.ErrMarginTooSmall,
}

// recoveryWords are words each kind's Recovery must contain to say what to do next.
var recoveryWords = map[interceptor.Kind][]string{
	interceptor.InProgress:       {"retry after", "do not dispatch"},
	interceptor.UnknownOutcome:   {"reconcile", "do not retry"},
	interceptor.AwaitingUpstream: {"poll", "not a success"},
	interceptor.PayloadMismatch:  {"different arguments", "first result"},
	interceptor.LeaseLost:        {"evidence", "do not retry"},
	interceptor.MarginTooSmall:   {"nothing was sent", "retry"},
}

// requireViolation asserts that err is a *Violation of kind that wraps the kind's sentinel,
// names the key and says what recovery is due.
func requireViolation(t *testing.T, err error, kind interceptor.Kind, key string) *interceptor.Violation {
	t.Helper()
	require.Error(t, err)
	var v *interceptor.Violation
	require.True(t, errors.As(err, &v), "want a *Violation %s, got %T: %v", kind, err, err)
	require.Equal(t, kind, v.Kind, "violation kind: %v", err)
	require.ErrorIs(t, err, sentinels[kind], "violation %s must wrap its residual sentinel", kind)
	require.Equal(t, key, v.Key)
	require.NotEmpty(t, v.Recovery, "violation %s must say what recovery is due", kind)
	for _, w := range recoveryWords[kind] {
		require.Contains(t, v.Recovery, w, "recovery of %s", kind)
	}
	msg := err.Error()
	require.Contains(t, msg, string(kind))
	require.Contains(t, msg, key)
	require.Contains(t, msg, v.Recovery)
	for other, s := range sentinels {
		if other != kind && s != sentinels[kind] && !errors.Is(v.Cause, s) {
			require.NotErrorIs(t, err, s, "violation %s must not match the sentinel of %s", kind, other)
		}
	}
	return v
}

// flakyLedger is a ledger whose steps can be made to fail; anything not overridden goes to
// the embedded real ledger.
type flakyLedger struct {
	ledger.Ledger
	reserveErr error
	commitErr  error
	renewErr   error
	// commitLost: the next commit lands in the real ledger but its answer is lost (the
	// caller gets an error wrapping ledger.ErrOutcomeUnknown).
	commitLost atomic.Bool
	// afterReserve runs after a successful real Reserve.
	afterReserve func()
	renews       atomic.Int32
}

func (l *flakyLedger) Reserve(ctx context.Context, p ledger.ReserveParams) (*ledger.ReserveResult, error) {
	if l.reserveErr != nil {
		return nil, l.reserveErr
	}
	res, err := l.Ledger.Reserve(ctx, p)
	if err == nil && l.afterReserve != nil {
		l.afterReserve()
	}
	return res, err
}

func (l *flakyLedger) Commit(ctx context.Context, p ledger.CommitParams) (*residual.Residual, error) {
	if l.commitErr != nil {
		return nil, l.commitErr
	}
	if l.commitLost.Swap(false) {
		_, err := l.Ledger.Commit(ctx, p)
		return nil, errors.Join(fmt.Errorf("%w: the answer was lost", ledger.ErrOutcomeUnknown), err)
	}
	return l.Ledger.Commit(ctx, p)
}

func (l *flakyLedger) Renew(ctx context.Context, p ledger.RenewParams) (lease.Lease, error) {
	l.renews.Add(1)
	if l.renewErr != nil {
		return lease.Lease{}, l.renewErr
	}
	return l.Ledger.Renew(ctx, p)
}

// waitUntil polls cond until it holds (true) or done closes (false). It waits for
// goroutines to reach a state, never for time to pass: the fake clock only moves when the
// test moves it. A watchdog fails the test when neither happens for a minute of real time
// (something is stuck), instead of hanging.
func waitUntil(t testing.TB, done <-chan struct{}, cond func() bool) bool {
	t.Helper()
	watchdog := time.After(time.Minute)
	for !cond() {
		select {
		case <-done:
			return false
		case <-watchdog:
			t.Fatal("waitUntil: stuck: the condition never held and the call never ended")
		case <-time.After(100 * time.Microsecond):
		}
	}
	return true
}

// outcome is what one Do returned, for calls run in a goroutine.
type outcome struct {
	res *interceptor.Result
	err error
}

func goDo(ctx context.Context, ic *interceptor.Interceptor, call interceptor.Call, fn interceptor.ToolFunc) (<-chan outcome, <-chan struct{}) {
	ch := make(chan outcome, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := ic.Do(ctx, call, fn)
		ch <- outcome{res, err}
	}()
	return ch, done
}
