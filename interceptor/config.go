package interceptor

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
)

// Defaults of Options.
const (
	DefaultNamespace = "default"
	DefaultLeaseTTL  = 30 * time.Second
	DefaultMaxArgs   = 1 << 20   // 1 MiB
	DefaultMaxResult = 256 << 10 // 256 KiB
)

// Options configure an Interceptor. Every field has a useful zero value.
type Options struct {
	// Namespace scopes keys and residuals (a tenant, an environment). Defaults to "default".
	Namespace string
	// Holder names this process in leases and audits. Defaults to host:pid:random.
	Holder string
	// LeaseTTL is the lease length of each attempt; long calls renew it. Defaults to 30s.
	LeaseTTL time.Duration
	// Margin that must be left on the lease at dispatch and at commit. Defaults to 50ms.
	Margin time.Duration
	// RenewEvery is how often a running call renews its lease. Defaults to LeaseTTL/3;
	// negative disables renewal (the call is then cut off before the lease expires).
	RenewEvery time.Duration
	// MaxArgs caps the size of a call's arguments in bytes. Defaults to 1 MiB.
	MaxArgs int
	// MaxResult caps the cached result in bytes; longer results are cut, keep the digest of
	// the whole and are marked truncated. Defaults to 256 KiB.
	MaxResult int
	// Clock is the process clock (dispatch deadlines, margins). Defaults to lease.Real.
	Clock lease.Clock
	// Classifier classifies outcomes of operations without their own. Defaults to
	// DefaultClassifier.
	Classifier Classifier
	// Redact, when set, rewrites a result before it is cached (to drop secrets); the digest
	// is still of the full result. The caller of the first execution gets the full result.
	Redact func(operation string, result []byte) []byte
	// Operations holds per-operation policies by operation name.
	Operations map[string]Operation
	// TracerProvider makes the spans of guarded calls (execute_tool {operation}) and their
	// ledger steps. Defaults to the global provider (otel.GetTracerProvider()). While it is a
	// no-op one, or no provider has been installed yet, tracing is off: no span, context or
	// attribute is made; a provider installed later is used from the next call on.
	TracerProvider trace.TracerProvider
	// MeterProvider makes toolfence's metrics (see docs/observability.md). Defaults to the
	// global provider (otel.GetMeterProvider()); while it is a no-op one or none is
	// installed, nothing is built or recorded per call.
	MeterProvider metric.MeterProvider
	// Logger, when set, gets one line per refused or ambiguous call (kind, key, operation,
	// attempt, recovery; never arguments, results or lease secrets). Defaults to nil: no logs.
	Logger *slog.Logger
}

// Operation is the per-operation policy.
type Operation struct {
	// Classify overrides the interceptor's classifier for this operation.
	Classify Classifier
	// Probe asks upstream what happened to an attempt; the reconciler uses it to settle
	// unknown and accepted residuals.
	Probe Probe
	// UpstreamIdempotent declares that upstream deduplicates by our key (the key is sent as
	// the Idempotency-Key), so an unknown attempt may be re-dispatched under the same key.
	UpstreamIdempotent bool
	// LeaseTTL overrides Options.LeaseTTL for this operation.
	LeaseTTL time.Duration
}

// ErrInvalidOptions is the one sentinel of unusable settings in toolfence: New's errors for
// bad Options wrap it, and so do those of every package that refuses its settings (options
// of the adapters, a proxy policy or pins file, a token file) through InvalidOptions.
var ErrInvalidOptions = errors.New("interceptor: invalid options")

// InvalidOptions returns an error about unusable settings: its text is what, ": " and the
// detail made of format and args as by fmt.Errorf ("mcpproxy: invalid policy: tool \"x\":
// ..."), and it wraps ErrInvalidOptions and whatever the detail wraps (%w).
func InvalidOptions(what, format string, args ...any) error {
	return &optionsError{what: what, detail: fmt.Errorf(format, args...)}
}

// optionsError is an error of InvalidOptions.
type optionsError struct {
	what   string
	detail error
}

func (e *optionsError) Error() string   { return e.what + ": " + e.detail.Error() }
func (e *optionsError) Unwrap() []error { return []error{ErrInvalidOptions, e.detail} }

func (c *Options) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
	}
	switch {
	case c.LeaseTTL < 0:
		return bad("LeaseTTL %v is negative", c.LeaseTTL)
	case c.Margin < 0:
		return bad("Margin %v is negative", c.Margin)
	case c.MaxArgs < 0:
		return bad("MaxArgs %d is negative", c.MaxArgs)
	case c.MaxResult < 0:
		return bad("MaxResult %d is negative", c.MaxResult)
	case c.MaxResult > ledger.MaxResult:
		return bad("MaxResult %d exceeds the largest result a ledger stores, %d", c.MaxResult, ledger.MaxResult)
	}
	if c.LeaseTTL <= c.Margin {
		return bad("LeaseTTL %v is not longer than the margin %v", c.LeaseTTL, c.Margin)
	}
	if err := c.checkOperation("", Operation{}); err != nil {
		return err
	}
	for name, op := range c.Operations {
		if name == "" {
			return bad("an operation has an empty name")
		}
		if err := c.checkOperation(name, op); err != nil {
			return err
		}
	}
	return nil
}

// checkOperation validates the lease of one operation (the defaults when name is empty)
// against the margin and the renewal interval.
func (c *Options) checkOperation(name string, op Operation) error {
	if name == "" {
		name = "(default)"
	}
	ttl := op.LeaseTTL
	if ttl == 0 {
		ttl = c.LeaseTTL
	}
	switch {
	case ttl <= c.Margin:
		return fmt.Errorf("%w: operation %s: lease %v is not longer than the margin %v", ErrInvalidOptions, name, ttl, c.Margin)
	case ttl > ledger.MaxLease:
		return fmt.Errorf("%w: operation %s: lease %v exceeds the longest lease a ledger grants, %v (renew longer calls: RenewEvery, Attempt.KeepAlive)",
			ErrInvalidOptions, name, ttl, ledger.MaxLease)
	case c.RenewEvery > 0 && c.RenewEvery >= ttl-c.Margin:
		return fmt.Errorf("%w: operation %s: RenewEvery %v must be shorter than the lease %v minus the margin %v, or every call is cut off",
			ErrInvalidOptions, name, c.RenewEvery, ttl, c.Margin)
	}
	return nil
}

// DefaultHolder returns host:pid:random, unique per process start.
func DefaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
