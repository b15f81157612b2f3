package ledgertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Harness tells the suite how to make ledgers of one backend.
type Harness struct {
	// Open returns a new, empty ledger for one subtest together with the hooks that drive
	// it. It is called once per subtest, from parallel subtests, and registers its own
	// cleanup with t.Cleanup; that cleanup must tolerate a ledger the suite already closed.
	Open func(t *testing.T) Fixture
	// TimePrecision is the resolution at which the backend stores instants: a stored lease
	// expiry may differ from the exact instant by less than this. Defaults to a nanosecond
	// (exact); PostgreSQL sets a microsecond.
	TimePrecision time.Duration
}

// Fixture is one ledger under test and the hooks that drive the clock it decides expiry by.
type Fixture struct {
	// Ledger is the ledger under test, empty when Open returns.
	Ledger ledger.Ledger
	// Advance moves the ledger's clock forward by d (for an embedded backend, a lease.Fake;
	// for a server-clock backend, the offset it adds to the server's time). Required.
	Advance func(t *testing.T, d time.Duration)
	// Now returns the ledger's current time on the clock Advance moves. Required.
	Now func(t *testing.T) time.Time
	// Reopen, when set, closes Ledger, opens the same store again with the same clock and
	// returns the new ledger; the suite then checks that residuals, fencing tokens and
	// evidence survive. Leave it nil for backends where reopening means nothing.
	Reopen func(t *testing.T) ledger.Ledger
}

// testCase is one named conformance check.
type testCase struct {
	name string
	run  func(e *env)
}

// Run runs every conformance case against h, each as a parallel subtest on a fresh ledger
// from h.Open. A failure names the case and the rule it checks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.Open, "ledgertest: Harness.Open is required")
	if h.TimePrecision <= 0 {
		h.TimePrecision = time.Nanosecond
	}
	var all []testCase
	all = append(all, reserveCases...)
	all = append(all, supersedeCases...)
	all = append(all, commitCases...)
	all = append(all, resolveCases...)
	all = append(all, listCases...)
	all = append(all, miscCases...)
	all = append(all, openCases...)
	for _, c := range all {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := h.Open(t)
			require.NotNil(t, f.Ledger, "ledgertest: Fixture.Ledger is required")
			require.NotNil(t, f.Advance, "ledgertest: Fixture.Advance is required")
			require.NotNil(t, f.Now, "ledgertest: Fixture.Now is required")
			c.run(&env{t: t, f: f, l: f.Ledger, ctx: t.Context(), prec: h.TimePrecision})
		})
	}
}

// Durations used by the cases. They are long so that a server clock moving in real time
// during a case does not change any outcome.
const (
	ttl    = time.Minute
	margin = 50 * time.Millisecond
	// pastTTL moves a lease of length ttl past its expiry.
	pastTTL = ttl + time.Minute
)

// env is what a case works with.
type env struct {
	t    *testing.T
	f    Fixture
	l    ledger.Ledger
	ctx  context.Context
	prec time.Duration
}

// call names one intended operation; the suite derives its key the way toolfence does.
type call struct {
	ns, task, op, target string
}

func (e *env) call(target string) call {
	return call{ns: "ns-" + e.t.Name(), task: "task-1", op: "email.send", target: target}
}

func (c call) key() string { return residual.Key(c.ns, c.task, c.op, c.target) }

func (c call) reserve(holder, digest string) ledger.ReserveParams {
	return ledger.ReserveParams{
		Namespace: c.ns, Key: c.key(), Task: c.task, Operation: c.op, Target: c.target,
		Holder: holder, RequestDigest: digest, TTL: ttl,
	}
}

func (c call) commit(holder string, token uint64, outcome residual.State) ledger.CommitParams {
	return ledger.CommitParams{
		Namespace: c.ns, Key: c.key(), Holder: holder, Token: token, Outcome: outcome,
		Margin: margin,
	}
}

func (c call) get() ledger.GetParams { return ledger.GetParams{Namespace: c.ns, Key: c.key()} }

func (e *env) now() time.Time { return e.f.Now(e.t) }

func (e *env) advance(d time.Duration) { e.f.Advance(e.t, d) }

// reserve calls Reserve and requires that it did not fail.
func (e *env) reserve(p ledger.ReserveParams) *ledger.ReserveResult {
	e.t.Helper()
	res, err := e.l.Reserve(e.ctx, p)
	require.NoError(e.t, err, "reserve %s by %s", p.Key, p.Holder)
	require.NotNil(e.t, res)
	require.NotNil(e.t, res.Residual, "reserve must return the residual it decided on")
	return res
}

// acquire reserves and requires Acquired.
func (e *env) acquire(p ledger.ReserveParams) *ledger.ReserveResult {
	e.t.Helper()
	res := e.reserve(p)
	require.Equal(e.t, ledger.Acquired, res.Decision, "reserve %s by %s", p.Key, p.Holder)
	return res
}

// commit calls Commit and requires that it succeeded.
func (e *env) commit(p ledger.CommitParams) *residual.Residual {
	e.t.Helper()
	r, err := e.l.Commit(e.ctx, p)
	require.NoError(e.t, err, "commit %s token %d as %s", p.Key, p.Token, p.Outcome)
	require.NotNil(e.t, r)
	return r
}

// get calls Get and requires that the residual exists.
func (e *env) get(c call) *residual.Residual {
	e.t.Helper()
	r, err := e.l.Get(e.ctx, c.get())
	require.NoError(e.t, err, "get %s", c.key())
	require.NotNil(e.t, r)
	return r
}

// list returns every residual of ns matching p, following cursors.
func (e *env) list(p ledger.ListParams) []*residual.Residual {
	e.t.Helper()
	var out []*residual.Residual
	for range 1000 {
		page, err := e.l.List(e.ctx, p)
		require.NoError(e.t, err)
		out = append(out, page.Residuals...)
		if page.NextCursor == "" {
			return out
		}
		p.Cursor = page.NextCursor
	}
	e.t.Fatal("list did not end after 1000 pages")
	return nil
}

// keys returns the keys of rs in order.
func keys(rs []*residual.Residual) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Key)
	}
	return out
}

// requireTime asserts that got is want up to the backend's time precision.
func (e *env) requireTime(want, got time.Time, msg string) {
	e.t.Helper()
	d := got.Sub(want).Abs()
	require.Less(e.t, d, e.prec, "%s: got %s, want %s", msg, got, want)
}

// requireTimeBetween asserts lo <= got <= hi up to the backend's time precision.
func (e *env) requireTimeBetween(lo, hi, got time.Time, msg string) {
	e.t.Helper()
	require.False(e.t, got.Before(lo.Add(-e.prec+1)), "%s: %s is before %s", msg, got, lo)
	require.False(e.t, got.After(hi.Add(e.prec-1)), "%s: %s is after %s", msg, got, hi)
}

// requireErr asserts that err wraps target.
func requireErr(t *testing.T, err, target error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Truef(t, errors.Is(err, target), "error %q does not wrap %q", err, target)
}
