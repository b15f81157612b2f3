package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// check collects the first input problem.
type check struct{ err error }

func (c *check) fail(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
}

func (c *check) required(name, v string) {
	if v == "" {
		c.fail("%s is required", name)
	}
}

func (c *check) size(name, v string, max int) {
	if len(v) > max {
		c.fail("%s is %d bytes long, the limit is %d", name, len(v), max)
	}
}

func (c *check) key(k string) {
	if k == "" {
		c.fail("key is required")
		return
	}
	if err := residual.ValidKey(k); err != nil {
		c.fail("key %q is not a toolfence key: want \"tf1_\" followed by 64 lowercase hex digits", truncate(k, 80))
	}
}

func (c *check) token(t uint64) {
	if t == 0 {
		c.fail("token is required (the fencing token begin_call returned, at least 1)")
	}
}

func (sp *space) leaseTTL(c *check, ms int64, required bool) time.Duration {
	if ms == 0 {
		if required {
			c.fail("lease_ms is required")
		}
		return sp.srv.opts.DefaultLease
	}
	o := sp.srv.opts
	ttl := time.Duration(ms) * time.Millisecond
	switch {
	case ms < 0:
		c.fail("lease_ms %d is negative", ms)
	case ms > o.MaxLease.Milliseconds():
		c.fail("lease_ms %d exceeds the limit %d (%v)", ms, o.MaxLease.Milliseconds(), o.MaxLease)
	case ttl <= o.Margin:
		c.fail("lease_ms %d is not longer than the safety margin %v", ms, o.Margin)
	}
	return ttl
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// jsonValue returns b as a JSON value: b itself when it is valid JSON, else b as a string.
func jsonValue(b []byte) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	if json.Valid(b) {
		return append(json.RawMessage(nil), b...)
	}
	s, _ := json.Marshal(strings.ToValidUTF8(string(b), "\uFFFD"))
	return s
}

// caller names who is calling: the explicit holder, or one derived from the MCP client.
func caller(ctx context.Context, explicit string) string {
	if explicit != "" {
		return explicit
	}
	name := "agent"
	if s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		if n := s.GetClientInfo().Name; n != "" {
			name = n
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "mcp:" + name + ":" + hex.EncodeToString(b[:])
}

// ledgerError maps a ledger error of a read or write to an isError result.
func ledgerError(tool string, err error, key string) *mcp.CallToolResult {
	switch {
	case errors.Is(err, residual.ErrNotFound):
		return toolError(tool, kindNotFound, fmt.Sprintf("no residual with key %s in this namespace", key),
			"check the key (list_pending shows open residuals); keys of other namespaces are not visible")
	case errors.Is(err, ledger.ErrInvalidParams), errors.Is(err, residual.ErrInvalidKey), errors.Is(err, residual.ErrInvalidState):
		return toolError(tool, kindInvalidInput, err.Error(), "fix the arguments and call again; nothing was written")
	default:
		return toolError(tool, kindUnavailable, "the ledger failed: "+err.Error(), "try again later")
	}
}

func (sp *space) get(ctx context.Context, key string) (*residual.Residual, error) {
	return sp.ic.Ledger().Get(ctx, ledger.GetParams{Namespace: sp.ns, Key: key})
}

func (sp *space) listPending(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[ListPendingInput](req)
	if err != nil {
		return invalid(ToolListPending, err), nil
	}
	var c check
	states := openStates
	if in.State != "" {
		st, err := residual.ParseState(in.State)
		if err != nil || !st.Open() {
			c.fail("state %q: want pending, unknown or accepted", truncate(in.State, 40))
		}
		states = []residual.State{st}
	}
	if in.Limit < 0 || in.Limit > ledger.MaxListLimit {
		c.fail("limit %d: want 1 to %d", in.Limit, ledger.MaxListLimit)
	}
	for name, v := range map[string]string{"task": in.Task, "operation": in.Operation, "target": in.Target, "cursor": in.Cursor} {
		c.size(name, v, sp.srv.opts.MaxField)
	}
	if c.err != nil {
		return invalid(ToolListPending, c.err), nil
	}
	page, err := sp.ic.Ledger().List(ctx, ledger.ListParams{
		Namespace: sp.ns, States: states, Task: in.Task, Operation: in.Operation, Target: in.Target,
		Limit: in.Limit, Cursor: in.Cursor,
	})
	if err != nil {
		return ledgerError(ToolListPending, err, ""), nil
	}
	now := sp.srv.opts.Clock.Now()
	out := ListResult{Residuals: make([]ResidualSummary, 0, len(page.Residuals)), NextCursor: page.NextCursor}
	var b strings.Builder
	fmt.Fprintf(&b, "%d open residual(s)", len(page.Residuals))
	if page.NextCursor != "" {
		b.WriteString(" (more: pass next_cursor)")
	}
	for _, r := range page.Residuals {
		s := summarize(r, now)
		out.Residuals = append(out.Residuals, s)
		fmt.Fprintf(&b, "\n- %s %s %s on %q (task %q, attempt %d): %s", s.State, s.Key, s.Operation, s.Target, s.Task, s.Attempt, s.Recovery)
	}
	return okResult(out, b.String()), nil
}

func summarize(r *residual.Residual, now time.Time) ResidualSummary {
	s := ResidualSummary{
		Key: r.Key, Task: r.Task, Operation: r.Operation, Target: r.Target, State: r.State,
		Token: r.Token, Handle: r.Handle, Since: r.CreatedAt, Recovery: recoveryFor(r, now),
	}
	if a := r.Current(); a != nil {
		s.Attempt, s.Holder, s.Since, s.LeaseExpiresAt = a.N, a.Holder, a.Started, a.LeaseExpires
	}
	return s
}

func (sp *space) inspect(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[InspectInput](req)
	if err != nil {
		return invalid(ToolInspect, err), nil
	}
	var c check
	c.key(in.Key)
	if c.err != nil {
		return invalid(ToolInspect, c.err), nil
	}
	r, err := sp.get(ctx, in.Key)
	if err != nil {
		return ledgerError(ToolInspect, err, in.Key), nil
	}
	v := view(r, sp.srv.opts.Clock.Now())
	return okResult(v, fmt.Sprintf("%s is %s (%s %q, task %q, %d attempt(s)): %s",
		r.Key, r.State, r.Operation, r.Target, r.Task, len(r.Attempts), v.Recovery)), nil
}

func view(r *residual.Residual, now time.Time) ResidualView {
	v := ResidualView{
		Key: r.Key, Namespace: r.Namespace, Task: r.Task, Operation: r.Operation, Target: r.Target,
		State: r.State, RequestDigest: r.RequestDigest, Attempts: append([]residual.Attempt{}, r.Attempts...),
		Result: jsonValue(r.Result), ResultDigest: r.ResultDigest, ResultTruncated: r.ResultTruncated,
		Handle: r.Handle, Resolutions: r.Resolutions, Token: r.Token, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, Recovery: recoveryFor(r, now),
	}
	for _, e := range r.Evidence {
		v.Evidence = append(v.Evidence, EvidenceView{
			At: e.At, Holder: e.Holder, Token: e.Token, Outcome: e.Outcome, ResponseDigest: e.ResponseDigest,
			Result: jsonValue(e.Result), Handle: e.Handle, Note: e.Note,
		})
	}
	return v
}

func (sp *space) begin(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[BeginInput](req)
	if err != nil {
		return invalid(ToolBegin, err), nil
	}
	o := sp.srv.opts
	var c check
	c.required("task", in.Task)
	c.required("operation", in.Operation)
	c.required("target", in.Target)
	for name, v := range map[string]string{"task": in.Task, "operation": in.Operation, "target": in.Target, "holder": in.Holder} {
		c.size(name, v, o.MaxField)
	}
	args := bytes.TrimSpace(in.Args)
	switch {
	case len(args) == 0 || string(args) == "null":
		c.fail("args is required (a JSON object; {} when the call takes none)")
	case args[0] != '{':
		c.fail("args must be a JSON object")
	case len(args) > o.MaxArgs:
		c.fail("args is %d bytes, the limit is %d", len(args), o.MaxArgs)
	}
	ttl := sp.leaseTTL(&c, in.LeaseMS, false)
	if c.err != nil {
		return invalid(ToolBegin, c.err), nil
	}
	digest, err := residual.Digest(args)
	if err != nil {
		return invalid(ToolBegin, fmt.Errorf("args: %w", err)), nil
	}
	secret := newLeaseSecret()
	holder := holderOf(caller(ctx, in.Holder), secret)
	key := sp.ic.Key(in.Task, in.Operation, in.Target)
	op := o.Operations[in.Operation]

	// Reserve, measuring the local deadline from before the request was sent, as the
	// interceptor does: it is never later than the ledger's expiry.
	started := o.Clock.Now()
	res, err := sp.ic.Ledger().Reserve(context.WithoutCancel(ctx), ledger.ReserveParams{
		Namespace: sp.ns, Key: key, Task: in.Task, Operation: in.Operation, Target: in.Target,
		Holder: holder, RequestDigest: digest, TTL: ttl, Redispatch: op.UpstreamIdempotent,
	})
	if err != nil {
		if errors.Is(err, ledger.ErrInvalidParams) {
			return invalid(ToolBegin, err), nil
		}
		return toolError(ToolBegin, kindUnavailable, "the reservation could not be recorded: "+err.Error(),
			"do NOT perform the call (nothing guards it); call begin_call again later"), nil
	}
	r := res.Residual
	switch res.Decision {
	case ledger.Acquired:
	case ledger.Replay:
		out := BeginResult{
			Decision: DecisionReplay, Key: key, Token: r.Token, Result: jsonValue(r.Result),
			ResultTruncated: r.ResultTruncated,
		}
		if a := r.Current(); a != nil {
			out.Attempt, out.Holder = a.N, a.Holder
		}
		return okResult(out, fmt.Sprintf("REPLAY: %s on %q already succeeded (key %s); use the cached result and do NOT perform the call again",
			in.Operation, in.Target, key)), nil
	default:
		v := blockedViolation(res, started)
		out := BeginResult{Decision: DecisionBlocked, Key: key, Attempt: v.Attempt, Token: v.Token, Holder: v.Holder, Violation: v}
		return okResult(out, fmt.Sprintf("BLOCKED (%s): do NOT perform the call. %s; recovery: %s", v.Kind, v.Message, v.Recovery)), nil
	}

	cur := r.Current()
	local := res.Lease
	local.Expires = started.Add(ttl)
	if err := local.CheckMargin(o.Clock.Now(), o.Margin); err != nil {
		_, cerr := sp.ic.Ledger().Commit(context.WithoutCancel(ctx), ledger.CommitParams{
			Namespace: sp.ns, Key: key, Holder: holder, Token: local.Token,
			Outcome: residual.Failed, Error: "not dispatched: " + err.Error(),
		})
		msg := err.Error()
		if cerr != nil {
			msg += "; recording the attempt as not dispatched failed too: " + cerr.Error()
		}
		v := &Violation{
			Kind: string(interceptor.MarginTooSmall), Message: msg, Recovery: recoveryMarginTooSmall,
			State: residual.Failed, Attempt: cur.N, Holder: holder, Token: local.Token, Since: cur.Started,
		}
		out := BeginResult{Decision: DecisionBlocked, Key: key, Attempt: cur.N, Token: local.Token, Holder: holder, Violation: v}
		return okResult(out, fmt.Sprintf("BLOCKED (%s): do NOT perform the call. %s", v.Kind, msg)), nil
	}
	out := BeginResult{
		Decision: DecisionProceed, Key: key, Attempt: cur.N, Token: local.Token, Holder: holder,
		LeaseSecret: secret, LeaseExpiresAt: res.Lease.Expires, LeaseMS: ttl.Milliseconds(),
	}
	// The summary line does not repeat the secret; it reaches the caller in the result only.
	return okResult(out, fmt.Sprintf("PROCEED: perform %s on %q once, then commit_call with key %s, token %d and this result's "+
		"lease_secret within %v (renew_lease for longer calls); keep lease_secret to yourself: it makes you the holder; "+
		"send the key upstream as Idempotency-Key if it supports one",
		in.Operation, in.Target, key, local.Token, ttl)), nil
}

// blockedViolation describes a blocking reservation decision.
func blockedViolation(res *ledger.ReserveResult, now time.Time) *Violation {
	r := res.Residual
	kind := map[ledger.Decision]interceptor.Kind{
		ledger.InProgress: interceptor.InProgress, ledger.UnknownOutcome: interceptor.UnknownOutcome,
		ledger.AwaitingUpstream: interceptor.AwaitingUpstream, ledger.PayloadMismatch: interceptor.PayloadMismatch,
	}[res.Decision]
	v := &Violation{Kind: string(kind), State: r.State, Handle: r.Handle, Recovery: recoveries[kind], Token: r.Token}
	a := r.Current()
	if a != nil {
		v.Attempt, v.Holder, v.Token, v.Since = a.N, a.Holder, a.Token, a.Started
	}
	switch kind {
	case interceptor.InProgress:
		if a != nil {
			v.RetryAfterMS = max(a.LeaseExpires.Sub(now), 0).Milliseconds()
		}
		v.Message = fmt.Sprintf("%s on %q is in flight under a live lease held by %s (attempt %d, token %d)", r.Operation, r.Target, v.Holder, v.Attempt, v.Token)
	case interceptor.UnknownOutcome:
		v.Message = fmt.Sprintf("%s on %q may have reached upstream (attempt %d by %s) and its outcome was never recorded", r.Operation, r.Target, v.Attempt, v.Holder)
	case interceptor.AwaitingUpstream:
		v.Message = fmt.Sprintf("upstream accepted %s on %q but has not finished it (handle %q)", r.Operation, r.Target, r.Handle)
	case interceptor.PayloadMismatch:
		v.Result = jsonValue(r.Result)
		v.Message = fmt.Sprintf("%s on %q already succeeded with different arguments", r.Operation, r.Target)
	default:
		v.Kind, v.Message = res.Decision.String(), "blocked by the ledger: "+res.Decision.String()
	}
	return v
}

func (sp *space) commit(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[CommitInput](req)
	if err != nil {
		return invalid(ToolCommit, err), nil
	}
	o := sp.srv.opts
	var c check
	c.key(in.Key)
	c.token(in.Token)
	outcome := residual.State(in.Outcome)
	switch outcome {
	case residual.Succeeded, residual.Accepted, residual.Failed, residual.Unknown:
	case "":
		c.fail("outcome is required: succeeded, accepted, failed or unknown")
	default:
		c.fail("outcome %q: want succeeded, accepted, failed or unknown", truncate(in.Outcome, 40))
	}
	c.size("handle", in.Handle, o.MaxField)
	c.size("error", in.Error, o.MaxField)
	if in.UpstreamStatus < 0 || in.UpstreamStatus > 999 {
		c.fail("upstream_status %d: want an HTTP status (100 to 599) or 0", in.UpstreamStatus)
	}
	result := bytes.TrimSpace(in.Result)
	if string(result) == "null" {
		result = nil
	}
	if limit := o.MaxArgs + o.MaxResult; len(result) > limit {
		c.fail("result is %d bytes, the limit is %d", len(result), limit)
	}
	if len(in.UpstreamBody) > o.MaxArgs+o.MaxResult {
		c.fail("upstream_body is %d bytes, the limit is %d", len(in.UpstreamBody), o.MaxArgs+o.MaxResult)
	}
	c.secret(in.LeaseSecret)
	if c.err != nil {
		return invalid(ToolCommit, c.err), nil
	}
	r, err := sp.get(ctx, in.Key)
	if err != nil {
		return ledgerError(ToolCommit, err, in.Key), nil
	}

	// Only the holder of the attempt commits it: the token is public, the secret is not.
	attempt, holder, refused := authorize(ToolCommit, r, in.Token, in.LeaseSecret)
	if refused != nil {
		return refused, nil
	}
	// Classify what the agent reports with the interceptor's rules: a queued answer is
	// never a success (nor a failure: the effect is in flight upstream), and a claim the
	// upstream status contradicts is refused unless it is more cautious.
	if refused := checkClaim(o.Operations[r.Operation].Classify, outcome, in, upstreamBody(in.UpstreamBody, result)); refused != nil {
		return refused, nil
	}

	sum := sha256.Sum256(result)
	digest := hex.EncodeToString(sum[:])
	// Store what the interceptor would: redacted (the digest stays that of the whole result).
	cached, truncated := sp.ic.Redact(r.Operation, result), false
	if len(cached) > o.MaxResult {
		cached, truncated = cached[:o.MaxResult], true
	}
	stored, err := sp.ic.Ledger().Commit(context.WithoutCancel(ctx), ledger.CommitParams{
		Namespace: sp.ns, Key: in.Key, Holder: holder, Token: in.Token, Outcome: outcome,
		ResponseDigest: digest, Result: cached, ResultDigest: digest, ResultTruncated: truncated,
		Handle: in.Handle, Error: in.Error, Margin: o.Margin,
	})
	switch {
	case errors.Is(err, residual.ErrLeaseLost):
		if stored == nil {
			stored = r
		}
		v := &Violation{
			Kind: string(interceptor.LeasePreempted), Message: err.Error(), Recovery: recoveries[interceptor.LeasePreempted],
			State: stored.State, Attempt: attempt.N, Holder: attempt.Holder, Token: in.Token, Since: attempt.Started,
		}
		return errorResult(ToolCommit, ErrorInfo{Kind: kindLeaseLost, Message: "commit refused, the fence was lost: " + err.Error(),
			Recovery: v.Recovery, Violation: v}), nil
	case err != nil && (errors.Is(err, ledger.ErrInvalidParams) || errors.Is(err, residual.ErrNotFound)):
		return ledgerError(ToolCommit, err, in.Key), nil
	case err != nil:
		return toolError(ToolCommit, kindUnavailable, "the outcome was not recorded: "+err.Error(),
			"call commit_call again with the same key and token while the lease lasts; after that the key reads as unknown and must be reconciled"), nil
	}
	out := CommitResult{
		Key: in.Key, State: stored.State, Attempt: attempt.N, Token: in.Token, Handle: stored.Handle,
		ResultDigest: digest, ResultTruncated: truncated, RecordedAt: stored.UpdatedAt,
	}
	summary := fmt.Sprintf("recorded %s for %s (attempt %d, token %d)", stored.State, in.Key, attempt.N, in.Token)
	if outcome == residual.Accepted && in.Handle == "" {
		summary += "; no handle was given, so a successor cannot poll upstream for it"
	}
	return okResult(out, summary), nil
}

// upstreamBody is the body the classifier looks at: upstream_body (a JSON string stands for
// the text it holds), or else the result.
func upstreamBody(raw json.RawMessage, result []byte) []byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return result
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return []byte(s)
		}
	}
	return raw
}

func (sp *space) renew(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[RenewInput](req)
	if err != nil {
		return invalid(ToolRenew, err), nil
	}
	var c check
	c.key(in.Key)
	c.token(in.Token)
	ttl := sp.leaseTTL(&c, in.LeaseMS, true)
	c.secret(in.LeaseSecret)
	if c.err != nil {
		return invalid(ToolRenew, c.err), nil
	}
	r, err := sp.get(ctx, in.Key)
	if err != nil {
		return ledgerError(ToolRenew, err, in.Key), nil
	}
	_, holder, refused := authorize(ToolRenew, r, in.Token, in.LeaseSecret)
	if refused != nil {
		return refused, nil
	}
	l, err := sp.ic.Ledger().Renew(context.WithoutCancel(ctx), ledger.RenewParams{
		Namespace: sp.ns, Key: in.Key, Holder: holder, Token: in.Token, TTL: ttl,
	})
	switch {
	case errors.Is(err, residual.ErrLeaseLost):
		v := &Violation{Kind: string(interceptor.LeasePreempted), Message: err.Error(), Recovery: recoveryRenewLost,
			State: r.State, Holder: holder, Token: in.Token}
		return errorResult(ToolRenew, ErrorInfo{Kind: kindLeaseLost, Message: "renewal refused, the fence was lost: " + err.Error(),
			Recovery: v.Recovery, Violation: v}), nil
	case err != nil:
		return ledgerError(ToolRenew, err, in.Key), nil
	}
	out := RenewResult{Key: in.Key, Token: in.Token, LeaseExpiresAt: l.Expires}
	return okResult(out, fmt.Sprintf("lease of %s (token %d) renewed for %v", in.Key, in.Token, ttl)), nil
}

func (sp *space) resolve(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[ResolveInput](req)
	if err != nil {
		return invalid(ToolResolve, err), nil
	}
	o := sp.srv.opts
	var c check
	c.key(in.Key)
	as := residual.State(in.As)
	switch as {
	case residual.Succeeded, residual.Failed:
	case "":
		c.fail("as is required: succeeded or failed")
	default:
		c.fail("as %q: want succeeded or failed", truncate(in.As, 40))
	}
	c.required("note", strings.TrimSpace(in.Note))
	for name, v := range map[string]string{"note": in.Note, "evidence": in.Evidence, "by": in.By} {
		c.size(name, v, o.MaxField)
	}
	result := bytes.TrimSpace(in.Result)
	if string(result) == "null" {
		result = nil
	}
	if len(result) > 0 && as == residual.Failed {
		c.fail("result is only kept when resolving as succeeded")
	}
	if len(result) > o.MaxResult {
		c.fail("result is %d bytes, the limit is %d", len(result), o.MaxResult)
	}
	if c.err != nil {
		return invalid(ToolResolve, c.err), nil
	}
	stored, err := sp.ic.Ledger().Resolve(context.WithoutCancel(ctx), ledger.ResolveParams{
		Namespace: sp.ns, Key: in.Key, As: as, By: caller(ctx, in.By), Note: in.Note,
		Evidence: in.Evidence, Result: result,
	})
	switch {
	case errors.Is(err, residual.ErrInProgress):
		return toolError(ToolResolve, kindInProgress, err.Error(),
			"a live lease covers the key and its holder may still commit; wait until the lease expires (the key then reads as unknown) and resolve it then"), nil
	case errors.Is(err, residual.ErrInvalidTransition):
		return toolError(ToolResolve, kindInvalidTransition, err.Error(), "nothing to resolve: inspect_residual shows its record"), nil
	case err != nil:
		return ledgerError(ToolResolve, err, in.Key), nil
	}
	from := residual.None
	if n := len(stored.Resolutions); n > 0 {
		from = stored.Resolutions[n-1].From
	}
	out := ResolveResult{Key: in.Key, From: from, State: stored.State, Token: stored.Token}
	return okResult(out, fmt.Sprintf("%s resolved %s → %s (new token %d: older holders are fenced out)", in.Key, from, stored.State, stored.Token)), nil
}

func (sp *space) reconcile(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[ReconcileInput](req)
	if err != nil {
		return invalid(ToolReconcile, err), nil
	}
	var c check
	if in.Key != "" {
		c.key(in.Key)
		if in.Task != "" || in.Operation != "" {
			c.fail("give either key, or task and/or operation, not both")
		}
	}
	c.size("task", in.Task, sp.srv.opts.MaxField)
	c.size("operation", in.Operation, sp.srv.opts.MaxField)
	if c.err != nil {
		return invalid(ToolReconcile, c.err), nil
	}
	rep, err := sp.ic.Reconcile(ctx, interceptor.ReconcileParams{
		Key: in.Key, Task: in.Task, Operation: in.Operation, By: "reconcile:" + caller(ctx, ""),
	})
	if err != nil {
		return ledgerError(ToolReconcile, err, in.Key), nil
	}
	out := ReconcileResult{Resolved: []ReconcileSettled{}, Open: []ReconcileOpen{}}
	var b strings.Builder
	fmt.Fprintf(&b, "probes settled %d residual(s), %d left open", len(rep.Resolved), len(rep.Open))
	for _, s := range rep.Resolved {
		out.Resolved = append(out.Resolved, ReconcileSettled{Key: s.Key, From: s.From, To: s.To, Token: s.Token, Evidence: s.Evidence})
		fmt.Fprintf(&b, "\n- settled %s: %s → %s", s.Key, s.From, s.To)
	}
	for _, u := range rep.Open {
		out.Open = append(out.Open, ReconcileOpen{Key: u.Key, State: u.State, Reason: u.Reason})
		fmt.Fprintf(&b, "\n- open %s (%s): %s", u.Key, u.State, u.Reason)
	}
	return okResult(out, b.String()), nil
}
