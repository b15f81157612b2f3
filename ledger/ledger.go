package ledger

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/residual"
)

// Ledger stores residuals and their leases. Implementations are safe for concurrent use by
// many goroutines (and, for shared backends, many processes). Every method is one atomic
// step: it either happens whole and durably (a write has been synced to stable storage
// before the method returns nil) or not at all.
//
// Business outcomes (a key in progress, a replay, a stale fence) are reported in results or
// as errors wrapping residual's sentinels. Malformed parameters get an error wrapping
// ErrInvalidParams (and, for a malformed key, residual.ErrInvalidKey) from every method of
// every backend, before anything is read or written. An error wrapping ErrOutcomeUnknown
// means a write may or may not have landed: the caller must treat the step as unknown and
// re-read (Get) or repeat it (an identical Commit is answered with what was recorded). Any
// other error means the step did not happen. For Reserve, every error means nothing may be
// dispatched (fail closed): a reservation that landed unseen blocks its key as unknown once
// its lease expires.
//
// Lease expiry is decided by the ledger's clock: the injected clock for embedded backends,
// the database server's clock for shared ones.
type Ledger interface {
	// Reserve atomically inspects the key and, when the key is free (no residual, or the
	// last attempt failed, or it is unknown and p.Redispatch is set, or it succeeded and
	// p.Supersede names its token), bumps the fencing token, writes a lease and a pending
	// residual with a new attempt, and returns Decision Acquired with the lease. Otherwise
	// it writes nothing and returns the existing residual with the Decision that applies
	// (Replay, InProgress, UnknownOutcome, AwaitingUpstream, PayloadMismatch). The
	// residual keeps its first attempt and a bounded number of the latest ones
	// (ledger/rules.KeepAttempts); Residual.AttemptCount counts every attempt ever made.
	Reserve(ctx context.Context, p ReserveParams) (*ReserveResult, error)

	// Commit writes the terminal outcome of the attempt holding p.Token and releases its
	// lease, in one step, only if the residual is pending, its current attempt carries
	// p.Holder and p.Token, and more than p.Margin is left on the lease at the ledger's
	// clock. Otherwise it appends what the caller observed as evidence and returns an
	// error wrapping residual.ErrLeaseLost (and the stored residual); it releases nothing.
	// A missing residual (never reserved, or collected by GC) is a lost fence too: an error
	// wrapping residual.ErrLeaseLost and residual.ErrNotFound, no residual, nothing written.
	// Outcome may be Succeeded, Accepted, Failed or Unknown.
	//
	// A commit identical to one that already landed (same key, holder, token, outcome,
	// response and result digests, handle: a retry whose first answer was lost) writes
	// nothing and returns the stored residual with a nil error. A different commit under
	// that token is refused as above.
	Commit(ctx context.Context, p CommitParams) (*residual.Residual, error)

	// Renew extends the lease of the attempt holding p.Token to now+p.TTL if it is still
	// live and held by p.Holder; otherwise it returns an error wrapping
	// residual.ErrLeaseLost (and also residual.ErrNotFound when the residual is missing).
	Renew(ctx context.Context, p RenewParams) (lease.Lease, error)

	// Resolve settles an unknown or accepted residual as succeeded or failed: it takes a new
	// fencing token (so a zombie holder's late commit is refused), records the resolution
	// and releases any lease. A pending residual under a live lease gets an error wrapping
	// residual.ErrInProgress; a settled one an error wrapping residual.ErrInvalidTransition;
	// a missing one residual.ErrNotFound.
	Resolve(ctx context.Context, p ResolveParams) (*residual.Residual, error)

	// AppendEvidence adds an observation to a residual without changing its state. A
	// missing residual gives an error wrapping residual.ErrNotFound.
	AppendEvidence(ctx context.Context, p EvidenceParams) (*residual.Residual, error)

	// Get returns the residual with its effective state (an expired pending reads as
	// unknown), or an error wrapping residual.ErrNotFound.
	Get(ctx context.Context, p GetParams) (*residual.Residual, error)

	// List returns residuals of one namespace that match every set filter, ordered by key,
	// one page at a time. States filter on the effective state.
	List(ctx context.Context, p ListParams) (*Page, error)

	// GC deletes settled (succeeded or failed) residuals last updated before p.Before. It
	// never deletes pending, unknown or accepted residuals, and never resets a fencing
	// token: a key reserved again after GC gets a higher token than before.
	GC(ctx context.Context, p GCParams) (GCResult, error)

	// Close releases the backend's resources. Calls after Close return errors.
	Close() error
}

// Decision is what Reserve decided.
type Decision int

// Reserve decisions.
const (
	// Acquired: a new attempt is pending under the returned lease; the caller may dispatch.
	Acquired Decision = iota + 1
	// Replay: the key succeeded with the same request digest; return the cached result.
	Replay
	// InProgress: another holder's lease is live.
	InProgress
	// UnknownOutcome: a prior attempt may have reached upstream; reconcile first.
	UnknownOutcome
	// AwaitingUpstream: upstream accepted the call; poll its handle.
	AwaitingUpstream
	// PayloadMismatch: the key succeeded with other arguments.
	PayloadMismatch
)

var decisionNames = map[Decision]string{
	Acquired: "acquired", Replay: "replay", InProgress: "in_progress",
	UnknownOutcome: "unknown_outcome", AwaitingUpstream: "awaiting_upstream",
	PayloadMismatch: "payload_mismatch",
}

// String returns the decision's snake_case name.
func (d Decision) String() string {
	if s, ok := decisionNames[d]; ok {
		return s
	}
	return fmt.Sprintf("decision(%d)", int(d))
}

// Err returns the residual sentinel for a blocking decision, and nil for Acquired and Replay.
func (d Decision) Err() error {
	switch d {
	case InProgress:
		return residual.ErrInProgress
	case UnknownOutcome:
		return residual.ErrUnknownOutcome
	case AwaitingUpstream:
		return residual.ErrAwaitingUpstream
	case PayloadMismatch:
		return residual.ErrPayloadMismatch
	}
	return nil
}

// ReserveParams are the inputs of Reserve.
type ReserveParams struct {
	Namespace     string
	Key           string
	Task          string
	Operation     string
	Target        string
	Holder        string
	RequestDigest string
	// TTL is the lease length; it must be positive.
	TTL time.Duration
	// Redispatch allows a new attempt over an unknown residual with the same request
	// digest: only for operations declared upstream-idempotent, which re-dispatch under
	// the same upstream idempotency key.
	Redispatch bool
	// Supersede, when not zero, starts a new intent over a settled success: a residual
	// that is succeeded and whose token (Residual.Token: the token of the attempt that
	// committed it, or of the resolution that settled it) equals Supersede is reserved
	// anew, as attempt n+1 under a new fencing token and lease, pending, with this
	// request's digest (the same as before or not). Its earlier attempts stay in its
	// history; its cached result and handle are cleared, so nothing of the earlier intent
	// is ever replayed as the outcome of the new one.
	//
	// A caller that saw the key succeed (Replay, or a PayloadMismatch) and judged that
	// this call is a new intent, not a retry, passes the token it saw: the check and the
	// write are one atomic step, so of two callers that judged the same success at once
	// exactly one acquires (the other gets InProgress). A succeeded residual with another
	// token (superseded or settled again since) is decided as without Supersede: Replay
	// or PayloadMismatch, nothing written. Every other state is decided as without
	// Supersede too: pending, unknown and accepted still block (an outcome that may have
	// happened never lets a second dispatch through), failed and a missing key acquire
	// anyway. Zero (the default) never supersedes. At most MaxToken.
	Supersede uint64 `json:",omitempty"`
}

// Validate returns an error wrapping ErrInvalidParams that names the first missing or
// malformed field (for a malformed key it also wraps residual.ErrInvalidKey), or says that
// Key is not residual.Key of the namespace, task, operation and target.
func (p ReserveParams) Validate() error {
	if err := validTarget("reserve", p.Namespace, p.Key); err != nil {
		return err
	}
	if err := firstMissing("reserve", map[string]string{
		"namespace": p.Namespace, "task": p.Task, "operation": p.Operation,
		"holder": p.Holder, "request digest": p.RequestDigest,
	}, p.TTL); err != nil {
		return err
	}
	if err := bounded("reserve", p.TTL,
		ident("namespace", p.Namespace), ident("task", p.Task), ident("operation", p.Operation),
		ident("target", p.Target), name("holder", p.Holder), ident("request digest", p.RequestDigest)); err != nil {
		return err
	}
	if p.Supersede > MaxToken {
		return fmt.Errorf("%w: reserve: supersede %d is not a fencing token: no backend issues one above %d", ErrInvalidParams, p.Supersede, uint64(MaxToken))
	}
	if want := residual.Key(p.Namespace, p.Task, p.Operation, p.Target); p.Key != want {
		return fmt.Errorf("%w: reserve: key %s is not the key of its namespace, task, operation and target (%s): "+
			"a key is derived from its fields (residual.Key), never chosen", ErrInvalidParams, p.Key, want)
	}
	return nil
}

// ReserveResult is what Reserve decided and the residual it decided on.
type ReserveResult struct {
	Decision Decision
	// Residual is the stored record after the step: the new pending residual when
	// Acquired, the existing one otherwise (with its effective state).
	Residual *residual.Residual
	// Lease is set when Decision is Acquired.
	Lease lease.Lease
}

// CommitParams are the inputs of Commit.
type CommitParams struct {
	Namespace string
	Key       string
	Holder    string
	Token     uint64
	// Outcome is Succeeded, Accepted, Failed or Unknown.
	Outcome        residual.State
	ResponseDigest string
	// Result is the (redacted, capped) result to cache; ResultDigest the digest of the full
	// result before redaction and capping.
	Result          []byte
	ResultDigest    string
	ResultTruncated bool
	Handle          string
	Error           string
	// Margin that must be left on the lease at the ledger's clock when the commit lands.
	Margin time.Duration
}

// Validate returns an error wrapping ErrInvalidParams that names the first missing or
// malformed field (for a malformed key it also wraps residual.ErrInvalidKey).
func (p CommitParams) Validate() error {
	if err := validTarget("commit", p.Namespace, p.Key); err != nil {
		return err
	}
	switch p.Outcome {
	case residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown:
	default:
		return fmt.Errorf("%w: commit outcome %q (want succeeded, accepted, failed or unknown)", ErrInvalidParams, p.Outcome)
	}
	if p.Token == 0 {
		return fmt.Errorf("%w: commit: token is zero", ErrInvalidParams)
	}
	if err := firstMissing("commit", map[string]string{"namespace": p.Namespace, "holder": p.Holder}, 1); err != nil {
		return err
	}
	return bounded("commit", 0, ident("namespace", p.Namespace), name("holder", p.Holder),
		ident("response digest", p.ResponseDigest), ident("result digest", p.ResultDigest),
		text("handle", p.Handle), text("error", p.Error), result("result", p.Result))
}

// RenewParams are the inputs of Renew.
type RenewParams struct {
	Namespace string
	Key       string
	Holder    string
	Token     uint64
	TTL       time.Duration
}

// Validate returns an error wrapping ErrInvalidParams that names the first missing or
// malformed field (for a malformed key it also wraps residual.ErrInvalidKey).
func (p RenewParams) Validate() error {
	if err := validTarget("renew", p.Namespace, p.Key); err != nil {
		return err
	}
	if p.Token == 0 {
		return fmt.Errorf("%w: renew: token is zero", ErrInvalidParams)
	}
	if err := firstMissing("renew", map[string]string{"namespace": p.Namespace, "holder": p.Holder}, p.TTL); err != nil {
		return err
	}
	return bounded("renew", p.TTL, ident("namespace", p.Namespace), name("holder", p.Holder))
}

// ResolveParams are the inputs of Resolve.
type ResolveParams struct {
	Namespace string
	Key       string
	// As is Succeeded or Failed.
	As residual.State
	// By names who resolved (a person, a reconciler, an agent).
	By       string
	Note     string
	Evidence string
	// Result optionally sets the cached result when resolving as succeeded.
	Result []byte
	// ResultDigest is the SHA-256 (hex) of the whole result when Result was redacted or
	// cut; empty means the digest of Result. ResultTruncated says Result was cut.
	ResultDigest    string
	ResultTruncated bool
	// IfToken, when not zero, makes the resolve conditional: it happens only if the
	// residual's token (Residual.Token, for an open residual the fencing token of its latest
	// attempt) still equals IfToken, checked atomically with the write. Otherwise nothing is
	// written and Resolve returns an error wrapping residual.ErrTokenChanged. A caller that
	// looked at one attempt (a probe, a person) passes its token, so that what it found is
	// never recorded against a later attempt. Zero resolves whatever attempt is current.
	IfToken uint64 `json:",omitempty"`
}

// Validate returns an error wrapping ErrInvalidParams that names the first missing or
// malformed field (for a malformed key it also wraps residual.ErrInvalidKey).
func (p ResolveParams) Validate() error {
	if err := validTarget("resolve", p.Namespace, p.Key); err != nil {
		return err
	}
	if p.As != residual.Succeeded && p.As != residual.Failed {
		return fmt.Errorf("%w: resolve as %q (want succeeded or failed)", ErrInvalidParams, p.As)
	}
	if err := firstMissing("resolve", map[string]string{"namespace": p.Namespace, "by": p.By}, 1); err != nil {
		return err
	}
	return bounded("resolve", 0, ident("namespace", p.Namespace), name("by", p.By), text("note", p.Note),
		text("evidence", p.Evidence), ident("result digest", p.ResultDigest), result("result", p.Result))
}

// EvidenceParams are the inputs of AppendEvidence.
type EvidenceParams struct {
	Namespace string
	Key       string
	Evidence  residual.Evidence
}

// Validate returns an error wrapping ErrInvalidParams for an empty or malformed namespace,
// a malformed key (then also wrapping residual.ErrInvalidKey), an outcome that is not a
// state, or a field over its bound.
func (p EvidenceParams) Validate() error {
	if err := validTarget("append evidence", p.Namespace, p.Key); err != nil {
		return err
	}
	e := p.Evidence
	if e.Outcome != residual.None && !e.Outcome.Valid() {
		return fmt.Errorf("%w: append evidence: %w: outcome %q", ErrInvalidParams, residual.ErrInvalidState, e.Outcome)
	}
	return bounded("append evidence", 0, ident("namespace", p.Namespace), name("holder", e.Holder),
		ident("response digest", e.ResponseDigest), text("handle", e.Handle), text("note", e.Note),
		text("write id", e.WriteID), result("result", e.Result))
}

// GetParams are the inputs of Get.
type GetParams struct {
	Namespace string
	Key       string
}

// Validate returns an error wrapping ErrInvalidParams for an empty or malformed namespace
// and a malformed key (then also wrapping residual.ErrInvalidKey).
func (p GetParams) Validate() error {
	return validTarget("get", p.Namespace, p.Key)
}

// ListParams filter and page List. Empty filters match everything.
type ListParams struct {
	Namespace string
	States    []residual.State
	Task      string
	Operation string
	Target    string
	// Limit caps the page size. Defaults to 100; at most 1000.
	Limit int
	// Cursor is the NextCursor of the previous page; empty starts at the beginning.
	Cursor string
}

// Validate returns an error wrapping ErrInvalidParams for an empty or malformed namespace
// or a state that is not one of the five (then also wrapping residual.ErrInvalidState).
func (p ListParams) Validate() error {
	if err := validNamespace("list", p.Namespace); err != nil {
		return err
	}
	for _, st := range p.States {
		if !st.Valid() {
			return fmt.Errorf("%w: list: %w: %q", ErrInvalidParams, residual.ErrInvalidState, st)
		}
	}
	return nil
}

// Page is one page of List.
type Page struct {
	Residuals []*residual.Residual
	// NextCursor continues the listing; empty when this was the last page.
	NextCursor string
}

// GCParams select what GC deletes.
type GCParams struct {
	// Namespace limits GC to one namespace; empty means every namespace.
	Namespace string
	// Before: settled residuals last updated before this instant are deleted.
	Before time.Time
}

// Validate returns an error wrapping ErrInvalidParams for a malformed namespace (empty is
// allowed: every namespace).
func (p GCParams) Validate() error {
	if p.Namespace == "" {
		return nil
	}
	return validNamespace("gc", p.Namespace)
}

// GCResult says what GC did.
type GCResult struct {
	Deleted int
}

// ErrInvalidParams is wrapped by errors for malformed parameters; nothing was written.
var ErrInvalidParams = errors.New("ledger: invalid parameters")

// ErrOutcomeUnknown is wrapped by the error of a write whose outcome the backend cannot
// tell (for a shared backend: the connection broke after the write was sent, and what is
// stored could not be re-read, or no longer shows whether the write landed because the key
// moved on: another attempt took it, or GC collected it). The write may or may not have landed: the caller must treat
// the step as unknown and re-read before acting on it. For Reserve nothing may be
// dispatched; for Commit the residual stays pending until the lease expires (then unknown)
// unless the commit landed, and repeating the identical Commit tells which.
var ErrOutcomeUnknown = errors.New("ledger: outcome of the write is unknown")

// Errors of reaching a ledger and of access to it, for every door to one (ledger/remote,
// the ledger behind an MCP server, an HTTP endpoint guarded by httpguard): one sentinel per
// concept, which the packages wrap with what they know.
var (
	// ErrUnavailable: the store, or the server in front of it, could not be reached or
	// could not serve (nothing listens, the login was refused, the ledger behind a server
	// failed or is closed, the server is busy). Each door says whether the step may have
	// happened (ErrOutcomeUnknown is wrapped too when it may).
	ErrUnavailable = errors.New("ledger: unavailable")
	// ErrUnauthorized: the caller could not be identified: no credentials, or unknown
	// ones (HTTP 401).
	ErrUnauthorized = errors.New("ledger: unauthorized")
	// ErrForbidden: the caller is known but may not do this: another namespace, every
	// namespace, a web page's Origin, an endpoint it is not granted (HTTP 403).
	ErrForbidden = errors.New("ledger: forbidden")
)

// The bounds every backend enforces on a step's parameters (Validate), whatever door the
// step came through (the Go API, MCP, the proxy, the ledger protocol): a step over them gets
// an error wrapping ErrInvalidParams that names the field, and writes nothing.
const (
	// MaxField bounds the names of a step, in bytes: namespace, task, operation, target,
	// holder, by, and the digests.
	MaxField = 4 << 10
	// MaxText bounds its texts, in bytes: notes, error texts, handles, evidence.
	MaxText = 64 << 10
	// MaxResult bounds a result (cached or observed), in bytes.
	MaxResult = 1 << 20
	// MaxLease bounds a lease's length (Reserve and Renew TTL): a holder that needs longer
	// renews.
	MaxLease = 24 * time.Hour
	// MaxToken bounds a fencing token a step names (ReserveParams.Supersede): PostgreSQL
	// stores tokens as bigint, so no backend issues a larger one.
	MaxToken = math.MaxInt64
)

// DefaultListLimit and MaxListLimit bound List pages.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// validTarget checks the namespace and key every keyed step names.
func validTarget(op, namespace, key string) error {
	if err := residual.ValidKey(key); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidParams, op, err)
	}
	return validNamespace(op, namespace)
}

// validNamespace refuses an empty namespace and one holding a NUL byte (which no backend
// can store faithfully).
func validNamespace(op, namespace string) error {
	switch {
	case namespace == "":
		return fmt.Errorf("%w: %s: namespace is empty", ErrInvalidParams, op)
	case strings.IndexByte(namespace, 0) >= 0:
		return fmt.Errorf("%w: %s: namespace %q contains a NUL byte", ErrInvalidParams, op, namespace)
	}
	return nil
}

// bound is one field of a step and the bound it must keep.
type bound struct {
	name  string
	value string
	max   int
	// named: valid UTF-8 without control characters (holders and resolvers are names that
	// audits and terminals show); ident: valid UTF-8.
	named, ident bool
}

func ident(n, v string) bound { return bound{name: n, value: v, max: MaxField, ident: true} }
func name(n, v string) bound {
	return bound{name: n, value: v, max: MaxField, ident: true, named: true}
}
func text(n, v string) bound { return bound{name: n, value: v, max: MaxText} }
func result(n string, v []byte) bound {
	return bound{name: n, value: string(v), max: MaxResult}
}

// bounded checks each field against its bound, and ttl (when not zero) against MaxLease.
func bounded(op string, ttl time.Duration, fields ...bound) error {
	if ttl > MaxLease {
		return fmt.Errorf("%w: %s: lease ttl %v exceeds the longest lease, %v (renew a longer call)", ErrInvalidParams, op, ttl, MaxLease)
	}
	for _, f := range fields {
		switch {
		case len(f.value) > f.max:
			return fmt.Errorf("%w: %s: %s is %d bytes, the limit is %d", ErrInvalidParams, op, f.name, len(f.value), f.max)
		case f.ident && !utf8.ValidString(f.value):
			return fmt.Errorf("%w: %s: %s is not valid UTF-8", ErrInvalidParams, op, f.name)
		case f.named && strings.ContainsFunc(f.value, unicode.IsControl):
			return fmt.Errorf("%w: %s: %s %q contains a control character", ErrInvalidParams, op, f.name, f.value)
		}
	}
	return nil
}

func firstMissing(op string, fields map[string]string, ttl time.Duration) error {
	for _, name := range []string{"namespace", "task", "operation", "holder", "request digest", "by"} {
		if v, ok := fields[name]; ok && v == "" {
			return fmt.Errorf("%w: %s: %s is empty", ErrInvalidParams, op, name)
		}
	}
	if ttl <= 0 {
		return fmt.Errorf("%w: %s: lease ttl %v is not positive", ErrInvalidParams, op, ttl)
	}
	return nil
}
