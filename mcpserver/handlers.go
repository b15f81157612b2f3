package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpwire"
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

// maxName caps a name given for who acts (holder, by): it is recorded on every attempt and
// resolution and shown in every listing.
const maxName = 256

// name checks a name given for who acts: at most maxName bytes, no control characters and
// no '#' (which separates a holder's name from its secret's digest).
func (c *check) name(field, v string) {
	switch {
	case len(v) > maxName:
		c.fail("%s is %d bytes long, the limit is %d", field, len(v), maxName)
	case strings.ContainsFunc(v, unicode.IsControl):
		c.fail("%s holds control characters", field)
	case strings.ContainsRune(v, '#'):
		c.fail("%s holds '#', which separates a holder's name from its secret's digest", field)
	}
}

// text checks free text that is stored (note, evidence, error, handle): at most max bytes,
// and no control characters but tab and line breaks.
func (c *check) text(field, v string, max int) {
	c.size(field, v, max)
	if strings.ContainsFunc(v, func(r rune) bool { return unicode.IsControl(r) && r != '\n' && r != '\t' && r != '\r' }) {
		c.fail("%s holds control characters (only tab and line breaks are kept)", field)
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

// leaseTTL checks lease_ms against this surface's cap; 0 (when not required) means the
// interceptor's default. Whether it exceeds the safety margin is the interceptor's check.
func (sp *space) leaseTTL(c *check, ms int64, required bool) time.Duration {
	if ms == 0 {
		if required {
			c.fail("lease_ms is required")
		}
		return 0
	}
	o := sp.srv.opts
	switch {
	case ms < 0:
		c.fail("lease_ms %d is negative", ms)
	case ms > o.MaxLease.Milliseconds():
		c.fail("lease_ms %d exceeds the limit %d (%v)", ms, o.MaxLease.Milliseconds(), o.MaxLease)
	}
	return time.Duration(ms) * time.Millisecond
}

// cleanName keeps the printable runes of a self-reported name, at most maxClientName bytes.
func cleanName(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) || r == '#' {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, ""))
	if len(s) > maxClientName {
		s = truncate(s, maxClientName-len("…"))
	}
	return strings.TrimSpace(s)
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

// maxClientName caps the part of a holder taken from the MCP client's self-reported name.
const maxClientName = 64

// caller names who is calling: the explicit holder, or one derived from the MCP client's
// name (cleaned of control characters and cut at maxClientName bytes: it is the client's
// word, and it reaches the ledger).
func caller(ctx context.Context, explicit string) string {
	if explicit != "" {
		return explicit
	}
	name := "agent"
	if s, ok := server.ClientSessionFromContext(ctx).(server.SessionWithClientInfo); ok {
		if n := cleanName(s.GetClientInfo().Name); n != "" {
			name = n
		}
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "mcp:" + name + ":" + hex.EncodeToString(b[:])
}

// ledgerError maps a ledger error of a read or write to an isError result. A failure of the
// ledger itself is logged on the server and reaches the client only as a reference to the
// log line: its text may name the database's host, port, user and schema.
func (sp *space) ledgerError(tool string, err error, key string) *mcp.CallToolResult {
	switch {
	case errors.Is(err, residual.ErrNotFound):
		return toolError(tool, mcpwire.KindNotFound, fmt.Sprintf("no residual with key %s in this namespace", key),
			"check the key (list_pending shows open residuals); keys of other namespaces are not visible")
	case errors.Is(err, ledger.ErrInvalidParams), errors.Is(err, residual.ErrInvalidKey), errors.Is(err, residual.ErrInvalidState),
		errors.Is(err, interceptor.ErrInvalidCall), errors.Is(err, interceptor.ErrArgsTooLarge):
		return toolError(tool, mcpwire.KindInvalidInput, err.Error(), "fix the arguments and call again; nothing was written")
	default:
		return toolError(tool, mcpwire.KindUnavailable, sp.ledgerFailed(tool, err), "try again later")
	}
}

// ledgerFailed logs a failure of the ledger with a fresh reference and returns what the
// client is told instead of the error's text.
func (sp *space) ledgerFailed(what string, err error) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	ref := hex.EncodeToString(b[:])
	sp.srv.opts.Logger.Error("mcpserver: the ledger failed", "in", what, "namespace", sp.ns, "ref", ref, "err", err)
	return "the ledger failed (ref " + ref + ": the server's log has the details)"
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
		return sp.ledgerError(ToolListPending, err, ""), nil
	}
	now := sp.now()
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
		Token: r.Token, Handle: r.Handle, Since: r.CreatedAt, Recovery: interceptor.RecoveryFor(r, now),
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
		return sp.ledgerError(ToolInspect, err, in.Key), nil
	}
	v := view(r, sp.now())
	return okResult(v, fmt.Sprintf("%s is %s (%s %q, task %q, %d attempt(s)): %s",
		r.Key, r.State, r.Operation, r.Target, r.Task, max(r.AttemptCount, len(r.Attempts)), v.Recovery)), nil
}

func view(r *residual.Residual, now time.Time) ResidualView {
	v := ResidualView{
		Key: r.Key, Namespace: r.Namespace, Task: r.Task, Operation: r.Operation, Target: r.Target,
		State: r.State, RequestDigest: r.RequestDigest, Attempts: append([]residual.Attempt{}, r.Attempts...),
		AttemptCount: r.AttemptCount,
		Result:       mcpwire.JSONValue(r.Result), ResultDigest: r.ResultDigest, ResultTruncated: r.ResultTruncated,
		Handle: r.Handle, Resolutions: r.Resolutions, Token: r.Token, CreatedAt: r.CreatedAt,
		UpdatedAt: r.UpdatedAt, Recovery: interceptor.RecoveryFor(r, now),
	}
	for _, e := range r.Evidence {
		v.Evidence = append(v.Evidence, EvidenceView{
			At: e.At, Holder: e.Holder, Token: e.Token, Outcome: e.Outcome, ResponseDigest: e.ResponseDigest,
			Result: mcpwire.JSONValue(e.Result), Handle: e.Handle, Note: e.Note, WriteID: e.WriteID,
		})
	}
	return v
}

func (sp *space) begin(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[BeginInput](req)
	if err != nil {
		return invalid(ToolBegin, err), nil
	}
	var c check
	c.required("task", in.Task)
	c.required("operation", in.Operation)
	c.required("target", in.Target)
	for name, v := range map[string]string{"task": in.Task, "operation": in.Operation, "target": in.Target} {
		c.size(name, v, sp.srv.opts.MaxField)
	}
	c.name("holder", in.Holder)
	args := bytes.TrimSpace(in.Args)
	switch {
	case len(args) == 0 || string(args) == "null":
		c.fail("args is required (a JSON object; {} when the call takes none)")
	case args[0] != '{':
		c.fail("args must be a JSON object")
	}
	ttl := sp.leaseTTL(&c, int64(in.LeaseMS), false)
	if c.err != nil {
		return invalid(ToolBegin, c.err), nil
	}
	secret := newLeaseSecret()
	// The reservation must not be torn by a client that goes away mid-request.
	a, replay, err := sp.ic.Begin(interceptor.WithTask(context.WithoutCancel(ctx), in.Task),
		interceptor.Call{Operation: in.Operation, Target: in.Target, Args: args},
		interceptor.BeginOptions{Holder: holderOf(caller(ctx, in.Holder), secret), LeaseTTL: ttl})
	var v *interceptor.Violation
	switch {
	case replay != nil:
		out := BeginResult{
			Decision: DecisionReplay, Key: replay.Key, Attempt: replay.Attempt, Token: replay.Token,
			Result: mcpwire.JSONValue(replay.Output), ResultTruncated: replay.Truncated,
		}
		return okResult(out, fmt.Sprintf("REPLAY: %s on %q already succeeded (key %s); use the cached result and do NOT perform the call again",
			in.Operation, in.Target, replay.Key)), nil
	case errors.As(err, &v):
		vv := mcpwire.ViolationView(v)
		out := BeginResult{Decision: DecisionBlocked, Key: v.Key, Attempt: v.Attempt, Token: v.Token, Holder: v.Holder, Violation: vv}
		return okResult(out, fmt.Sprintf("BLOCKED (%s): do NOT perform the call. %s; recovery: %s", v.Kind, vv.Message, v.Recovery)), nil
	case errors.Is(err, interceptor.ErrNotDispatched):
		return toolError(ToolBegin, mcpwire.KindUnavailable, "the reservation could not be recorded: "+sp.ledgerFailed(ToolBegin, err),
			"do NOT perform the call (nothing guards it); call begin_call again later"), nil
	case err != nil:
		return sp.ledgerError(ToolBegin, err, ""), nil
	}
	d, l := a.Dispatch, a.Lease()
	out := BeginResult{
		Decision: DecisionProceed, Key: d.Key, Attempt: d.Attempt, Token: d.Token, Holder: a.Holder,
		LeaseSecret: secret, LeaseExpiresAt: l.Expires, LeaseMS: a.TTL().Milliseconds(),
	}
	// The summary line does not repeat the secret; it reaches the caller in the result only.
	return okResult(out, fmt.Sprintf("PROCEED: perform %s on %q once, then commit_call with key %s, token %d and this result's "+
		"lease_secret within %v (renew_lease for longer calls); keep lease_secret to yourself: it makes you the holder; "+
		"send the key upstream as Idempotency-Key if it supports one",
		in.Operation, in.Target, d.Key, d.Token, a.TTL())), nil
}

// violationError is the isError result of a violation raised by a commit or renewal.
func violationError(tool string, v *interceptor.Violation, what string) *mcp.CallToolResult {
	return errorResult(tool, mcpwire.ViolationInfo(v, what+": "+v.Describe()))
}

// resume finds the attempt of key under token for the caller holding secret. It returns the
// attempt, or the isError result of tool refusing it (nothing written).
func (sp *space) resume(ctx context.Context, tool, key string, token uint64, secret string) (*interceptor.Attempt, *mcp.CallToolResult) {
	a, err := sp.ic.Resume(ctx, interceptor.ResumeParams{Key: key, Token: token, Authorize: holds(secret)})
	var v *interceptor.Violation
	switch {
	case errors.As(err, &v):
		if errors.Is(err, errNotHolder) {
			v.Recovery = recoveryNotHolder
		}
		return nil, violationError(tool, v, "refused; nothing was written")
	case err != nil:
		return nil, sp.ledgerError(tool, err, key)
	}
	return a, nil
}

func (sp *space) commit(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[CommitInput](req)
	if err != nil {
		return invalid(ToolCommit, err), nil
	}
	o, cfg := sp.srv.opts, sp.ic.Settings()
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
	c.text("handle", in.Handle, o.MaxField)
	c.text("error", in.Error, o.MaxField)
	if in.UpstreamStatus != 0 && (in.UpstreamStatus < 100 || in.UpstreamStatus > 599) {
		c.fail("upstream_status %d: want an HTTP status (100 to 599) or 0", in.UpstreamStatus)
	}
	result := bytes.TrimSpace(in.Result)
	if string(result) == "null" {
		result = nil
	}
	if limit := cfg.MaxArgs + cfg.MaxResult; len(result) > limit {
		c.fail("result is %d bytes, the limit is %d", len(result), limit)
	}
	if len(in.UpstreamBody) > cfg.MaxArgs+cfg.MaxResult {
		c.fail("upstream_body is %d bytes, the limit is %d", len(in.UpstreamBody), cfg.MaxArgs+cfg.MaxResult)
	}
	c.secret(in.LeaseSecret)
	if c.err != nil {
		return invalid(ToolCommit, c.err), nil
	}
	a, refused := sp.resume(ctx, ToolCommit, in.Key, in.Token, in.LeaseSecret)
	if refused != nil {
		return refused, nil
	}
	res, err := a.Report(ctx, interceptor.Report{
		Outcome: outcome, Status: in.UpstreamStatus, Body: upstreamBody(in.UpstreamBody, result),
		Result: result, Handle: in.Handle, Error: in.Error,
	})
	var (
		v  *interceptor.Violation
		ce *interceptor.ClaimError
	)
	switch {
	case res != nil:
		// Recorded: err only says which outcome was not a success (ErrCallFailed, or an
		// AwaitingUpstream or UnknownOutcome violation); commit_call answers each alike.
	case errors.As(err, &ce):
		return toolError(ToolCommit, mcpwire.KindRefused, ce.Error(), ce.Recovery), nil
	case errors.Is(err, interceptor.ErrClassifierPanicked):
		return toolError(ToolCommit, mcpwire.KindInternal, err.Error(), "commit_call again with outcome=unknown; report the panic to the server's operator"), nil
	case errors.As(err, &v):
		return violationError(ToolCommit, v, "commit refused, the fence was lost"), nil
	case err != nil && (errors.Is(err, ledger.ErrInvalidParams) || errors.Is(err, residual.ErrNotFound)):
		return sp.ledgerError(ToolCommit, err, in.Key), nil
	case err != nil:
		return toolError(ToolCommit, mcpwire.KindUnavailable, sp.ledgerFailed(ToolCommit, err),
			"call commit_call again with the same key and token while the lease lasts; after that the key reads as unknown and must be reconciled"), nil
	}
	out := CommitResult{
		Key: res.Key, State: res.State, Attempt: res.Attempt, Token: res.Token, Handle: res.Handle,
		ResultDigest: res.ResultDigest, ResultTruncated: res.StoredTruncated, RecordedAt: res.RecordedAt,
	}
	summary := fmt.Sprintf("recorded %s for %s (attempt %d, token %d)", res.State, res.Key, res.Attempt, res.Token)
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
	ttl := sp.leaseTTL(&c, int64(in.LeaseMS), true)
	c.secret(in.LeaseSecret)
	if c.err != nil {
		return invalid(ToolRenew, c.err), nil
	}
	a, refused := sp.resume(ctx, ToolRenew, in.Key, in.Token, in.LeaseSecret)
	if refused != nil {
		return refused, nil
	}
	l, err := a.Renew(context.WithoutCancel(ctx), ttl)
	var v *interceptor.Violation
	switch {
	case errors.As(err, &v):
		return violationError(ToolRenew, v, "renewal refused, the fence was lost"), nil
	case err != nil:
		return sp.ledgerError(ToolRenew, err, in.Key), nil
	}
	out := RenewResult{Key: in.Key, Token: in.Token, LeaseExpiresAt: l.Expires}
	return okResult(out, fmt.Sprintf("lease of %s (token %d) renewed for %v", in.Key, in.Token, ttl)), nil
}

func (sp *space) resolve(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	in, err := decode[ResolveInput](req)
	if err != nil {
		return invalid(ToolResolve, err), nil
	}
	o, cfg := sp.srv.opts, sp.ic.Settings()
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
	c.text("note", in.Note, o.MaxField)
	c.text("evidence", in.Evidence, o.MaxField)
	c.name("by", in.By)
	result := bytes.TrimSpace(in.Result)
	if string(result) == "null" {
		result = nil
	}
	if limit := cfg.MaxArgs + cfg.MaxResult; len(result) > limit {
		c.fail("result is %d bytes, the limit is %d", len(result), limit)
	}
	if c.err != nil {
		return invalid(ToolResolve, c.err), nil
	}
	stored, err := sp.ic.Resolve(context.WithoutCancel(ctx), interceptor.ResolveParams{
		Key: in.Key, As: as, By: caller(ctx, in.By), Note: in.Note, Evidence: in.Evidence, Result: result,
	})
	switch {
	case errors.Is(err, residual.ErrInProgress):
		return toolError(ToolResolve, mcpwire.KindInProgress, err.Error(),
			"a live lease covers the key and its holder may still commit; wait until the lease expires (the key then reads as unknown) and resolve it then"), nil
	case errors.Is(err, residual.ErrInvalidTransition):
		return toolError(ToolResolve, mcpwire.KindInvalidTransition, err.Error(), "nothing to resolve: inspect_residual shows its record"), nil
	case err != nil:
		return sp.ledgerError(ToolResolve, err, in.Key), nil
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
		if in.Task != "" || in.Operation != "" || in.Cursor != "" {
			c.fail("give either key, or task and/or operation (and cursor), not both")
		}
	}
	c.size("task", in.Task, sp.srv.opts.MaxField)
	c.size("operation", in.Operation, sp.srv.opts.MaxField)
	c.size("cursor", in.Cursor, sp.srv.opts.MaxField)
	if c.err != nil {
		return invalid(ToolReconcile, c.err), nil
	}
	by := "reconcile:" + caller(ctx, "")
	out := ReconcileResult{ReconcileReport: interceptor.ReconcileReport{Settled: []interceptor.Settled{}, Unsettled: []interceptor.Unsettled{}}}
	keys := []string{in.Key}
	if in.Key == "" {
		// One page at a time: a namespace's open residuals are not bounded.
		page, err := sp.ic.Ledger().List(ctx, ledger.ListParams{
			Namespace: sp.ns, States: openStates, Task: in.Task, Operation: in.Operation,
			Limit: sp.srv.opts.PageSize, Cursor: in.Cursor,
		})
		if err != nil {
			return sp.ledgerError(ToolReconcile, err, ""), nil
		}
		keys, out.NextCursor = keys[:0], page.NextCursor
		for _, r := range page.Residuals {
			keys = append(keys, r.Key)
		}
	}
	for _, k := range keys {
		rep, err := sp.ic.Reconcile(ctx, interceptor.ReconcileParams{Key: k, By: by})
		switch {
		case errors.Is(err, residual.ErrNotFound) && in.Key == "":
			continue // collected since it was listed
		case err != nil:
			return sp.ledgerError(ToolReconcile, err, k), nil
		}
		out.Settled = append(out.Settled, rep.Settled...)
		out.Unsettled = append(out.Unsettled, rep.Unsettled...)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "probes settled %d residual(s), %d left open", len(out.Settled), len(out.Unsettled))
	if out.NextCursor != "" {
		b.WriteString("; more remain: call reconcile again with cursor set to next_cursor")
	}
	for _, s := range out.Settled {
		fmt.Fprintf(&b, "\n- settled %s: %s → %s", s.Key, s.From, s.To)
	}
	for _, u := range out.Unsettled {
		fmt.Fprintf(&b, "\n- open %s (%s): %s", u.Key, u.State, u.Reason)
	}
	return okResult(out, b.String()), nil
}
