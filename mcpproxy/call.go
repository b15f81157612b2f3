package mcpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/mcpproxy/transport"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// callParams are the parts of tools/call params the proxy reads; the params are forwarded
// upstream as the host sent them, but for the trace context in the _meta of a protected
// call (withTraceContext).
type callParams struct {
	Name      string                     `json:"name"`
	Arguments json.RawMessage            `json:"arguments"`
	Meta      map[string]json.RawMessage `json:"_meta"`
	// RequestState and InputResponses are what a continuation of a multi-round call
	// carries (SEP-2322).
	RequestState   string          `json:"requestState"`
	InputResponses json.RawMessage `json:"inputResponses"`
}

// hostCall is a host's tools/call as the proxy reads it, parsed once: its params, and
// when they are refused, the refusal (tool names the tool, or "tools/call" when the params
// name none).
type hostCall struct {
	req     *jsonrpc.Request
	params  callParams
	invalid string // "": the params may go on
	tool    string
}

// meta is what the call's _meta says of the host's revision (transport.ReadMeta, from the
// params already decoded).
func (c hostCall) meta() transport.RequestMeta {
	if c.params.Meta == nil {
		return transport.RequestMeta{}
	}
	m := transport.RequestMeta{HasMeta: true, Capabilities: c.params.Meta[transport.MetaClientCapabilities], ClientInfo: c.params.Meta[transport.MetaClientInfo]}
	_ = json.Unmarshal(c.params.Meta[transport.MetaProtocolVersion], &m.Version)
	return m
}

// parseCall decodes req's params and checks their keys (checkParamKeys).
func parseCall(req *jsonrpc.Request) hostCall {
	c := hostCall{req: req}
	perr := json.Unmarshal(req.Params, &c.params)
	c.tool = c.params.Name
	switch {
	case perr != nil || c.params.Name == "":
		c.tool = "tools/call"
		c.invalid = fmt.Sprintf("invalid tools/call request, nothing was sent upstream: want params with a tool name (%v)", perr)
	default:
		if err := checkParamKeys(req.Params); err != nil {
			c.invalid = "invalid tools/call request, nothing was sent upstream: " + err.Error()
		}
	}
	return c
}

// relayIfBypassed relays a bypassed tools/call at once, on the goroutine that read it, when
// the upstream's tool list is cached: no goroutine and no hand-off for a call the proxy only
// relays (each hand-off costs a wake-up, measured in internal/checks/proxybench). It returns false,
// having done nothing, for every other call; call handles those.
func (s *session) relayIfBypassed(ctx context.Context, c hostCall) bool {
	if c.invalid != "" {
		return false
	}
	cat, catErr := s.toolList().cached(s.p.clock().Now())
	if cat == nil || catErr != nil {
		return false
	}
	params := c.params
	info := lookupTool(cat, params.Name)
	if d := s.p.decide(params.Name, info); d.Protect || s.pinRefusal(params.Name, info, d) != "" {
		return false
	}
	ctx, span := s.p.startCall(ctx, c.req.ID, params)
	resp := s.headerMismatch(c.req, params.Name)
	if resp == nil {
		resp = s.relay(ctx, c.req, params.Name, span)
	}
	if resp != nil {
		endCall(span, resp)
		s.answerResponse(ctx, resp, nil)
	}
	return true
}

// headerMismatch checks the Mcp-Param-* headers of a stateless HTTP host's tools/call
// (carried in req.Extra) against the x-mcp-header bindings of its tool, and returns the
// host's answer when they do not match (JSON-RPC -32020, HTTP 400; nothing sent), else nil.
// (Mcp-Method, Mcp-Name and the revision were checked before the request reached the
// session.)
func (s *session) headerMismatch(req *jsonrpc.Request, tool string) *jsonrpc.Response {
	h, ok := req.Extra.(http.Header)
	if !ok {
		return nil
	}
	if err := transport.CheckRequestHeaders(h, req, s.toolList().binding(tool)); err != nil {
		return &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: transport.CodeHeaderMismatch, Message: "toolfence proxy: " + err.Error() + "; nothing was sent upstream"}}
	}
	return nil
}

// call handles one tools/call of the host: forwarded untouched for a bypassed tool, through
// the barrier for a protected one. Each gets a span (startCall), ended as its answer goes
// to the host.
func (s *session) call(ctx context.Context, c hostCall) {
	defer s.wg.Done()
	req, params := c.req, c.params
	ctx, span := s.p.startCall(ctx, req.ID, params)
	var resp *jsonrpc.Response // the host's answer, unless upstream gives it (bypass)
	var done settled           // the success it carries, if any
	defer func() {
		if resp != nil {
			endCall(span, resp) // before the host can see the answer, so its trace is complete
			// Recorded as delivered before it is written: the host may send its next call as
			// soon as it reads the answer, and that call must find it delivered (repeat.go).
			// Over HTTP it is recorded only once the answer has a stream the host reads;
			// undone when the answer did not reach the host.
			undo := func() {}
			var delivered func()
			if done.key != "" {
				delivered = func() { undo = s.p.seen.deliver(done.key, done.token, s.p.clock().Now()) }
			}
			if !s.answerResponse(ctx, resp, delivered) {
				undo()
			}
		}
	}()
	answer := func(result json.RawMessage) { resp = &jsonrpc.Response{ID: req.ID, Result: result} }
	if c.invalid != "" {
		s.p.log.Warn("toolfence proxy: call refused: invalid tools/call request", "kind", mcpwire.KindInvalidInput)
		answer(refusal(c.tool, mcpwire.KindInvalidInput, c.invalid))
		return
	}
	cat, err := s.toolFor(ctx, params.Name)
	if err != nil {
		kind := mcpwire.KindUnavailable
		if errors.Is(err, interceptor.ErrInvalidOptions) {
			kind = mcpwire.KindPolicy
		}
		s.p.log.Warn("toolfence proxy: call refused", "kind", kind, "tool", params.Name, "err", err)
		answer(refusal(params.Name, kind, fmt.Sprintf("refused: %v; nothing was sent upstream", err)))
		return
	}
	info := lookupTool(cat, params.Name)
	if info == nil && !s.pinned(params.Name) {
		// The upstream's own list (fetched in this session, again after list_changed) lacks
		// the tool: upstream could only refuse it, so nothing is reserved or sent. The spec's
		// answer to an unknown tool is a JSON-RPC error -32602. (A pinned tool gone from the
		// list gets its pin's refusal below, which tells the operator what to do.)
		s.p.log.Warn("toolfence proxy: call refused: the upstream does not list the tool", "tool", params.Name)
		resp = &jsonrpc.Response{ID: req.ID, Error: &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
			Message: fmt.Sprintf("Unknown tool: %s (the upstream does not list it; nothing was sent upstream)", params.Name)}}
		return
	}
	d := s.p.decide(params.Name, info)
	if st := s.pinRefusal(params.Name, info, d); st != "" {
		s.p.log.Warn("toolfence proxy: call refused: pinned tool definition changed", "kind", mcpwire.KindPin, "tool", params.Name, "pin", st)
		answer(refusal(params.Name, mcpwire.KindPin, pinRefusal(params.Name, st)))
		return
	}
	if resp = s.headerMismatch(req, params.Name); resp != nil {
		return
	}
	if !d.Protect {
		resp = s.relay(ctx, req, params.Name, span)
		return
	}
	if pins := s.p.cfg.Pins; pins != nil {
		if st := pins.Status(params.Name, info); st != "ok" {
			s.p.log.Warn("toolfence proxy: call refused: the tool definition does not match its pin", "kind", mcpwire.KindPin, "tool", params.Name, "pin", st)
			answer(refusal(params.Name, mcpwire.KindPin, pinRefusal(params.Name, st)))
			return
		}
	}
	// The host's cancellation ends only the proxy's wait for its user (an elicitation): a
	// dispatched call runs to its answer and is recorded, so the host's retry is answered
	// from the ledger (a call cut off mid-flight would be unknown and block the key). Its
	// answer is then not written: the host no longer waits for it, and never had it.
	callCtx, cancel := context.WithCancelCause(ctx)
	hk := hostKey(req.ID)
	s.mu.Lock()
	s.calls[hk] = cancel
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.calls, hk)
		s.mu.Unlock()
		cancel(nil)
	}()
	resp, done = s.guard(callCtx, req, params, d.Rule)
	if callCtx.Err() != nil {
		endCall(span, resp)
		resp = nil // the host cancelled the call: its answer stays in the ledger
	}
}

// settled names the success a guarded call's answer carries (a fresh one or a replay): once
// the host had that answer, an identical call may be a new intent (repeat.go). Zero for
// any other answer.
type settled struct {
	key   string
	token uint64
}

// decide is the policy's decision on a tool (policy.Decide), but that a tool once decided
// protected in this proxy's life is never bypassed because of its annotations: an upstream
// that re-annotates it readOnlyHint: true (after list_changed, or in a later session) is
// ignored, logged once per tool. Only the policy file's explicit bypass relays it.
func (p *Proxy) decide(name string, info *policy.ToolInfo) policy.Decision {
	d := p.cfg.Policy.Decide(name, info)
	switch {
	case d.Protect:
		p.protected.Store(name, struct{}{})
		return d
	case p.cfg.Policy.ExplicitBypass(name):
		return d
	}
	if _, was := p.protected.Load(name); !was {
		return d
	}
	if _, logged := p.reannotated.LoadOrStore(name, struct{}{}); !logged {
		p.log.Info("toolfence proxy: the upstream re-annotated a protected tool read-only; it stays protected (annotations only make a tool stricter)",
			"server", p.cfg.ServerID, "tool", name)
	}
	return policy.Decision{Protect: true, Rule: d.Rule, Why: "protected earlier in the proxy's life; its re-annotation " + d.Why + " is ignored"}
}

// paramKeys are the keys of tools/call params the proxy reads.
var paramKeys = [...]string{"name", "arguments", "_meta"}

// checkParamKeys refuses tools/call params (a JSON object) holding a key the proxy reads
// twice, or a key that differs from one only in case ("Name"): encoding/json matches keys
// regardless of case and keeps the last, while a case-sensitive upstream (the TypeScript
// and Python SDKs) reads the exact key, so the proxy could judge one tool or one set of
// arguments and upstream run another. The params are relayed as the host sent them, so
// they must mean one thing.
func checkParamKeys(params json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(params))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("params must be a JSON object")
	}
	var seen [len(paramKeys)]bool
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("params: %w", err)
		}
		key, _ := tok.(string)
		for i, want := range paramKeys {
			switch {
			case !strings.EqualFold(key, want):
			case key != want:
				return fmt.Errorf("params key %q: write it %q (keys are case-sensitive, and a key that differs only in case could mean another tool or arguments upstream)", key, want)
			case seen[i]:
				return fmt.Errorf("params key %q is given twice", key)
			default:
				seen[i] = true
			}
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("params: %w", err)
		}
	}
	return nil
}

// pinned reports whether the catalog pins hold the named tool.
func (s *session) pinned(name string) bool {
	if s.p.cfg.Pins == nil {
		return false
	}
	_, ok := s.p.cfg.Pins.Pinned(name)
	return ok
}

// lookupTool is the upstream's definition of the named tool; nil when the list lacks it.
func lookupTool(cat map[string]policy.ToolInfo, name string) *policy.ToolInfo {
	if t, ok := cat[name]; ok {
		return &t
	}
	return nil
}

// pinRefusal is the pin status that refuses a call the policy would bypass ("" when the
// call may go): a pinned tool is checked before it may be bypassed, since a definition that
// changed since it was locked (say, annotated read-only now) must not turn a protected tool
// into a relayed one. Only the policy file's explicit bypass skips the check. (A protected
// call's pin is checked by call itself.)
func (s *session) pinRefusal(name string, info *policy.ToolInfo, d policy.Decision) string {
	pins := s.p.cfg.Pins
	if pins == nil || d.Protect || s.p.cfg.Policy.ExplicitBypass(name) {
		return ""
	}
	if _, pinned := pins.Pinned(name); !pinned {
		return ""
	}
	if st := pins.Status(name, info); st != "ok" {
		return st
	}
	return ""
}

// relay sends a bypassed call upstream untouched; its span ends when readUpstream passes
// upstream's answer on. It returns the host's answer only when the call could not be sent.
func (s *session) relay(ctx context.Context, req *jsonrpc.Request, tool string, span trace.Span) *jsonrpc.Response {
	s.relaying(req.ID, span)
	if err := s.up.Write(transport.WithParamBindings(ctx, s.toolList().binding(tool)), req); err != nil {
		s.mu.Lock()
		delete(s.relayed, hostKey(req.ID))
		s.mu.Unlock()
		return &jsonrpc.Response{ID: req.ID, Result: refusal(tool, mcpwire.KindUnavailable, "not sent: the upstream server is gone: "+err.Error())}
	}
	return nil
}

// answerWriter is a host connection that says whether an answer reached the host (the HTTP
// front end's: downConn.WriteAnswer); on others an answer written without error did.
type answerWriter interface {
	WriteAnswer(ctx context.Context, r *jsonrpc.Response, delivered func()) bool
}

// answerResponse writes the proxy's own answer to a host request (a guarded call's, a
// refusal, a replay) and reports whether it reached the host. delivered, when not nil, is
// called before the host can read the answer: over HTTP only when the answer has a stream
// the host reads, on other connections before the write. A stateless host gets a result
// with its resultType (SEP-2322).
func (s *session) answerResponse(ctx context.Context, r *jsonrpc.Response, delivered func()) bool {
	if r.Result != nil && transport.Stateless(s.hostRevision()) {
		r.Result = withResultType(r.Result)
	}
	if aw, ok := s.down.(answerWriter); ok {
		return aw.WriteAnswer(context.WithoutCancel(ctx), r, delivered)
	}
	if delivered != nil {
		delivered()
	}
	if err := s.down.Write(context.WithoutCancel(ctx), r); err != nil {
		s.p.log.Warn("toolfence proxy: the host is gone; the outcome is recorded in the ledger", "err", err)
		return false
	}
	return true
}

// guard runs one protected call through the barrier and returns the host's answer (with the
// host's id), and the success it carries, if any: Begin (judging an identical call over a
// success, asking the host's user when the call cannot tell, and settling an unknown
// outcome with upstream or the user), dispatch upstream once, classify, Report. A call of a
// key whose multi-round call is open continues it instead (rounds.go).
func (s *session) guard(ctx context.Context, req *jsonrpc.Request, params callParams, rule policy.Rule) (*jsonrpc.Response, settled) {
	p := s.p
	refuse := func(kind mcpwire.Kind, text string) (*jsonrpc.Response, settled) {
		p.log.Warn("toolfence proxy: call refused", "kind", kind, "tool", params.Name) // text may quote arguments
		return &jsonrpc.Response{ID: req.ID, Result: refusal(params.Name, kind, text)}, settled{}
	}
	task := p.cfg.Task
	raw, explicit := params.Meta[mcpwire.MetaTask]
	if explicit {
		if err := json.Unmarshal(raw, &task); err != nil || task == "" {
			return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: _meta %q must be a non-empty string", params.Name, mcpwire.MetaTask))
		}
	}
	args := params.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage(`{}`)
	}
	target, err := p.target(params.Name, rule, args)
	if err != nil {
		return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: %v", params.Name, err))
	}
	if k := rule.Key; k != nil && k.Argument != "" {
		var obj map[string]json.RawMessage
		if json.Unmarshal(args, &obj) != nil || obj == nil {
			return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: the arguments must be a JSON object to carry the key in argument %q", params.Name, k.Argument))
		}
	}
	up := "the upstream of " + params.Name
	call := interceptor.Call{Operation: p.cfg.ServerID + "/" + params.Name, Target: target, Args: args, CallID: fmt.Sprint(req.ID.Raw())}
	// The guarded call's span, as Do makes it: Begin and Report set its gen_ai.* and
	// toolfence.* attributes; upstream's request carries its trace context.
	ctx, span := p.startSpan(ctx, "execute_tool "+call.Operation, trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	bctx := interceptor.WithTask(context.WithoutCancel(ctx), task)
	key := p.ic.Key(task, call.Operation, target)
	digest, err := residual.Digest(args)
	if err != nil {
		return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: arguments are not valid JSON: %v", params.Name, err))
	}
	// The proxy's own question (ask.go) is answered in this call, and never sent upstream.
	answer := s.takeAnswer(params, key)
	upState := params.RequestState
	if ownState(upState) {
		upState = ""
	}
	hostParams := withoutOwnRound(req.Params, params)
	switch rd, refused := p.rounds.roundFor(p.ic.Namespace(), key, digest, upState); {
	case refused != "":
		return refuse(mcpwire.KindInProgress, refused)
	case rd == nil && bridged(upState):
		// A round of the bridge's that the proxy no longer holds (abandoned, or another
		// proxy's): continued, it would take an answer meant for that round's call.
		return refuse(mcpwire.KindInvalidInput, "refused: requestState names a round of a multi-round call that is no longer in progress (it lapsed, or the proxy restarted); nothing was sent. Make the call again without requestState")
	case rd != nil:
		sent, err := withKey(hostParams, rule.Key, rd.a.Dispatch.Key)
		if err != nil { // the same params were accepted by the round's first dispatch
			p.rounds.release(rd)
			return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: %v", params.Name, err))
		}
		resp, callErr := s.dispatch(ctx, rd.a, rd.keep, params.Name, rule, sent)
		return s.conclude(ctx, bctx, req, params.Name, rule, rd.a, rd.keep, rd, digest, resp, callErr)
	}
	var learned string // what upstream said about an open residual (probe, tasks/get)
	var asked *jsonrpc.Response
	opts := interceptor.BeginOptions{
		LeaseTTL: time.Duration(rule.Lease),
		// Ask upstream what became of an earlier attempt left unknown or accepted, then the
		// host's user (an unknown one, when upstream cannot say); when that settles it
		// (through the interceptor's Resolve), Begin reserves again: a replay, or a new attempt.
		Settle: func(_ context.Context, v *interceptor.Violation) bool {
			var resolved bool
			if learned, resolved = s.settle(ctx, bctx, v, params.Name, rule, args); resolved || v.Kind != interceptor.UnknownOutcome {
				return resolved
			}
			q := settleQuestion(params.Name, args, v, s.howItEnded(bctx, v), learned)
			choice, answeredIt := answer.about(askSettle, v.Token)
			if !answeredIt && s.canAsk() {
				choice, asked = s.ask(ctx, req, q)
			}
			if choice == choiceYes || choice == choiceNo {
				return s.resolveByUser(bctx, v, q, choice)
			}
			if choice != "" {
				learned = strings.TrimPrefix(learned+"; the host's user answered "+strconv.Quote(choice)+": it stays unknown until a person settles it", "; ")
			}
			return false
		},
	}
	for {
		a, replay, err := p.ic.Begin(bctx, call, opts)
		switch {
		case asked != nil: // the stateless host's user is asked first
			return asked, settled{}
		case replay != nil:
			if opts.Supersede != 0 { // begun again meanwhile and already settled: its answer
				return &jsonrpc.Response{ID: req.ID, Result: replayed(replay, "")}, settled{replay.Key, replay.Token}
			}
			verdict, why := p.judgeRepeat(p.ic.Namespace(), call.Operation, rule, explicit, replay, p.clock().Now())
			if verdict == repeatAsk {
				q := repeatQuestion(params.Name, replay, why)
				choice, answeredIt := answer.about(askRepeat, replay.Token)
				if !answeredIt && s.canAsk() {
					if choice, asked = s.ask(ctx, req, q); asked != nil {
						return asked, settled{}
					}
				}
				switch choice {
				case choiceRun:
					verdict, why = repeatSend, "the host's user chose to run it again"
				case "":
					why += "; toolfence could not ask the host's user (no elicitation, or no answer)"
				default:
					why = "the host's user chose not to run it again"
				}
			}
			if verdict == repeatSend {
				p.log.Info("toolfence proxy: an identical call is a new intent", "key", replay.Key, "tool", params.Name, "why", why)
				opts.Supersede = replay.Token
				continue
			}
			return &jsonrpc.Response{ID: req.ID, Result: replayed(replay, why)}, settled{replay.Key, replay.Token}
		case err != nil:
			return &jsonrpc.Response{ID: req.ID, Result: withNote(errorResult(params.Name, up, nil, err), learned)}, settled{}
		}
		p.seen.start(p.ic.Namespace(), call.Operation, key, p.clock().Now())
		sent, err := withKey(hostParams, rule.Key, a.Dispatch.Key)
		if err != nil {
			_ = a.Abandon(bctx, err)
			return refuse(mcpwire.KindInvalidInput, fmt.Sprintf("invalid input for %s, nothing was sent: %v", params.Name, err))
		}
		// The lease is renewed until the call is over: past this dispatch when upstream asks for
		// input (a round), so it lives on the proxy's time, not the request's.
		keep := a.KeepAlive(context.WithoutCancel(ctx))
		resp, callErr := s.dispatch(ctx, a, keep, params.Name, rule, sent)
		return s.conclude(ctx, bctx, req, params.Name, rule, a, keep, nil, digest, resp, callErr)
	}
}

// dispatch sends the protected call's params upstream once, under a's lease (renewed by
// keep), and waits until upstream answers, the tool's timeout, the lease's loss or the
// upstream's end; not the host's cancellation (call).
func (s *session) dispatch(ctx context.Context, a *interceptor.Attempt, keep *lease.Session, tool string, rule policy.Rule, sent json.RawMessage) (*jsonrpc.Response, error) {
	timeout := cmpDur(rule.Timeout, s.p.cfg.Timeout)
	dctx, stopTimer := context.WithTimeoutCause(keep.Ctx(), timeout, fmt.Errorf("no answer from upstream within %v", timeout))
	defer stopTimer()
	dctx = transport.WithParamBindings(dctx, s.toolList().binding(tool))
	return s.roundTripFor(dctx, a.Dispatch.Key, "tools/call", withTraceContext(ctx, sent))
}

// conclude settles upstream's answer (resp, or callErr when none came) to a dispatch of a
// and returns the host's answer. An input_required answer is a round, not an outcome: the
// attempt stays open (rd is opened, or kept when this was a continuation of rd) and the host
// gets upstream's answer. Any other answer is classified and recorded under the fence, and
// the lease released.
func (s *session) conclude(ctx, bctx context.Context, req *jsonrpc.Request, tool string, rule policy.Rule,
	a *interceptor.Attempt, keep *lease.Session, rd *round, digest string, resp *jsonrpc.Response, callErr error) (*jsonrpc.Response, settled) {
	p := s.p
	if inputRequired(resp) && keep.Err() == nil {
		if rd == nil {
			owner := s
			if s.stateless {
				owner = nil // its host continues in other requests
			}
			rd = p.rounds.open(p, owner, a.Dispatch.Key, tool, digest, a, keep)
		}
		p.rounds.again(p, rd, requestState(resp))
		return &jsonrpc.Response{ID: req.ID, Result: resp.Result}, settled{}
	}
	keep.Close()
	if rd != nil {
		p.rounds.end(rd)
	}
	up := "the upstream of " + tool
	rep := s.withKnownRefusal(tool, resp, classify(rule.NoEffect, resp, callErr))
	if rep.Handle != "" {
		// A task id means something in its upstream session (or, stateless, its server) only.
		rt, _ := transport.ResultType(resp.Result)
		rep.Handle = taskHandle{scope: s.handleScope(), id: rep.Handle, flat: rt == resultTask}.String()
	}
	res, err := a.Report(bctx, rep)
	var claim *interceptor.ClaimError
	if errors.As(err, &claim) {
		rep.Outcome = residual.Unknown
		res, err = a.Report(bctx, rep)
	}
	switch {
	case err == nil:
		return &jsonrpc.Response{ID: req.ID, Result: resp.Result}, settled{res.Key, res.Token}
	case res != nil && errors.Is(err, interceptor.ErrCallFailed):
		// Upstream's answer as it gave it: an isError result that proves no effect, or a
		// JSON-RPC error that means the call never ran.
		return &jsonrpc.Response{ID: req.ID, Result: resp.Result, Error: resp.Error}, settled{}
	case res == nil: // nothing recorded: the fence was lost, or the ledger failed
		return &jsonrpc.Response{ID: req.ID, Result: errorResult(tool, up, nil, err)}, settled{}
	}
	// Recorded as unknown or accepted: err is the interceptor's violation, recovery due.
	var upstream json.RawMessage
	if resp != nil {
		upstream = resp.Result
	}
	result := errorResult(tool, up, upstream, err)
	if strings.HasPrefix(rep.Error, isErrorPrefix) {
		result = withBlock(result, 0, ambiguousIsError)
	}
	return &jsonrpc.Response{ID: req.ID, Result: result}, settled{}
}

func cmpDur(a policy.Duration, b time.Duration) time.Duration {
	if a != 0 {
		return time.Duration(a)
	}
	return b
}

// target is the call's target: the policy's pointers into args, else the digest of args.
func (p *Proxy) target(tool string, rule policy.Rule, args json.RawMessage) (string, error) {
	if len(rule.Target) > 0 {
		return jsonptr.Target(tool, rule.Target, args)
	}
	d, err := residual.Digest(args)
	if err != nil {
		return "", fmt.Errorf("arguments are not valid JSON: %w", err)
	}
	if _, seen := p.warned.LoadOrStore(tool, struct{}{}); !seen {
		p.log.Warn("toolfence proxy: no target pointers for this tool: its target is the digest of its arguments, so a re-worded retry is not recognised as the same call; add \"target\" to its policy",
			"tool", tool)
	}
	return "args:" + d, nil
}

// replayNote is the first text block of a replay: that nothing was sent, when the identical
// call was recorded, why it was answered from the ledger (when the proxy judged it, why),
// and how to make it new work.
func replayNote(res *interceptor.Result, why string) string {
	var b strings.Builder
	b.WriteString(interceptor.ReplayPrefix)
	b.WriteString("not sent: toolfence answered this call from its ledger. An identical call (same tool and arguments) already ran and succeeded; its outcome was recorded at ")
	b.WriteString(res.RecordedAt.UTC().Format(time.RFC3339))
	b.WriteString(" and its recorded result follows")
	if res.Truncated {
		b.WriteString(" (result truncated)")
	}
	if why != "" {
		b.WriteString(". Answered from the ledger because ")
		b.WriteString(why)
	}
	b.WriteString(". To run it again as new work, send it with a new task in _meta \"" + mcpwire.MetaTask + "\".")
	return b.String()
}

// textBlock is an MCP text content block.
func textBlock(text string) map[string]any { return map[string]any{"type": "text", "text": text} }

// replayed is the host's answer to a replay: a tool result with a text block first that
// says it is a replay and why (replayNote), and mcpwire.MetaReplayed and mcpwire.MetaCall in its _meta.
// A recorded output is taken for a CallToolResult (upstream's answer, or a probe's) when it
// is whole and a JSON object with a "content" array, or without "content" but with
// "structuredContent", "isError" or "_meta" (a server that left content out; classify
// records such answers too): it is given back in its shape, the note before its content and
// its _meta merged. Anything else (a cut result, or what an operator gave `toolfence resolve
// --result`) follows the note as a text block, and a JSON object also as structuredContent;
// an empty output (resolved without --result) adds nothing.
func replayed(res *interceptor.Result, why string) json.RawMessage {
	note := replayNote(res, why)
	meta := map[string]any{mcpwire.MetaReplayed: true, mcpwire.MetaCall: map[string]any{
		"key": res.Key, "attempt": res.Attempt, "token": res.Token, "recorded_at": res.RecordedAt, "truncated": res.Truncated,
	}}
	var doc map[string]json.RawMessage
	var content []json.RawMessage
	isResult := !res.Truncated && json.Unmarshal(res.Output, &doc) == nil && doc != nil
	if raw, ok := doc["content"]; isResult && ok {
		isResult = json.Unmarshal(raw, &content) == nil && content != nil
	} else if isResult {
		_, structured := doc["structuredContent"]
		_, isError := doc["isError"]
		_, hasMeta := doc["_meta"]
		isResult = structured || isError || hasMeta
	}
	if !isResult {
		blocks := []any{textBlock(note)}
		if len(bytes.TrimSpace(res.Output)) > 0 {
			blocks = append(blocks, textBlock(string(res.Output)))
		}
		result := map[string]any{"content": blocks, "_meta": meta}
		if doc != nil {
			result["structuredContent"] = json.RawMessage(res.Output)
		}
		out, _ := json.Marshal(result)
		return out
	}
	first, _ := json.Marshal(textBlock(note))
	doc["content"], _ = json.Marshal(append([]json.RawMessage{first}, content...))
	var old map[string]json.RawMessage
	_ = json.Unmarshal(doc["_meta"], &old)
	merged := map[string]any{}
	for k, v := range old {
		merged[k] = v
	}
	for k, v := range meta {
		merged[k] = v
	}
	doc["_meta"], _ = json.Marshal(merged)
	out, _ := json.Marshal(doc)
	return out
}

// errorResult is the isError tool result of err about a call of tool: the observation the
// tools package renders (what happened, what to do), upstream's own content after it when
// there was an answer, and the details in _meta (mcpwire.MetaError).
func errorResult(tool, up string, upstream json.RawMessage, err error) json.RawMessage {
	info := mcpwire.ErrorInfo{Kind: mcpwire.KindUnavailable, Message: err.Error()}
	var v *interceptor.Violation
	switch {
	case errors.As(err, &v):
		info = mcpwire.ViolationInfo(v, v.Describe())
	case errors.Is(err, interceptor.ErrInvalidCall), errors.Is(err, interceptor.ErrArgsTooLarge), errors.Is(err, interceptor.ErrNoTask):
		info.Kind = mcpwire.KindInvalidInput
	}
	content := []any{textBlock(interceptor.Observe(tool, up, nil, err))}
	var doc struct {
		Content []json.RawMessage `json:"content"`
	}
	if len(upstream) > 0 && json.Unmarshal(upstream, &doc) == nil {
		for _, c := range doc.Content {
			content = append(content, c)
		}
	}
	out, _ := json.Marshal(map[string]any{"content": content, "isError": true, "_meta": map[string]any{mcpwire.MetaError: info}})
	return out
}

// refusal is an isError result for a call refused before the barrier.
func refusal(tool string, kind mcpwire.Kind, text string) json.RawMessage {
	out, _ := json.Marshal(map[string]any{"content": []any{textBlock(text)}, "isError": true,
		"_meta": map[string]any{mcpwire.MetaError: mcpwire.ErrorInfo{Kind: kind, Message: text}}})
	return out
}
