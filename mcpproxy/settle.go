package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/mcpproxy/policy"
	"github.com/toolfence/toolfence/residual"
)

// settlement is what upstream said about an earlier attempt: Succeeded (with the result to
// replay) or Failed settle it; anything else leaves it open, with the reason.
type settlement struct {
	outcome  residual.State
	result   json.RawMessage
	evidence string
}

// settle asks upstream what became of the earlier attempt of an open residual that blocked
// a call (v: unknown outcome or awaiting upstream): tasks/get (and tasks/result) for an
// accepted residual whose handle is an MCP task id, then the tool's probe when the policy has
// one. A definite answer is recorded through the interceptor's Resolve (a new fencing token,
// the evidence in the audit). It returns what upstream said (for the host's answer) and
// whether it resolved the residual, in which case the caller begins again.
//
// The probe is only asked when the call's arguments are those of the earlier attempt (same
// request digest): it looks the effect up by them. For an accepted residual only a probe that
// finds the effect settles it: "not found" may mean the task has not acted yet.
func (s *session) settle(ctx, bctx context.Context, v *interceptor.Violation, tool string, rule policy.Rule, args json.RawMessage) (string, bool) {
	timeout := cmpDur(rule.Timeout, s.p.cfg.Timeout)
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("no answer from upstream within %v", timeout))
	defer cancel()
	accepted := v.Kind == interceptor.AwaitingUpstream
	got := settlement{outcome: residual.Unknown}
	var notes []string
	if accepted && v.Handle != "" {
		if h, ok := parseTaskHandle(v.Handle); ok && h.scope == s.handleScope() {
			got = s.taskOutcome(ctx, h, rule)
		} else {
			// Task ids are per upstream session: asking another session about it could
			// be answered about another task.
			got = settlement{outcome: residual.Unknown, evidence: fmt.Sprintf("task %s belongs to an earlier upstream session, so tasks/get was not asked in this one: check upstream, then toolfence resolve", v.Handle)}
		}
		notes = append(notes, got.evidence)
	}
	if !got.outcome.Terminal() && rule.Probe != nil {
		if !v.RequestMatches {
			notes = append(notes, "the probe was not asked: these arguments differ from the earlier attempt's, which it would have to look up")
		} else {
			pr := s.probe(ctx, rule.Probe, args)
			// "Not found" does not settle an accepted call: upstream may not have acted yet.
			// Nor an unknown one whose attempt began less than not_found_after ago: it may
			// still be running upstream (a timeout, a cancellation, a killed proxy) and act
			// after the probe looked.
			switch {
			case pr.outcome == residual.Succeeded:
				got = pr
			case pr.outcome == residual.Failed && !accepted:
				if why := s.notFoundTooSoon(v, rule.Probe, timeout); why != "" {
					notes = append(notes, pr.evidence+"; "+why)
				} else {
					got = pr
				}
			default:
				notes = append(notes, pr.evidence)
			}
		}
	}
	if !got.outcome.Terminal() {
		got.evidence = strings.Join(notes, "; ")
	}
	if got.evidence == "" {
		return "", false
	}
	if !got.outcome.Terminal() {
		s.p.log.Info("toolfence proxy: upstream did not settle the earlier attempt", "key", v.Key, "tool", tool, "evidence", got.evidence)
		return got.evidence, false
	}
	rp := interceptor.ResolveParams{
		Key: v.Key, As: got.outcome, By: "toolfence-proxy:" + s.p.ic.Holder(), Evidence: got.evidence,
		Note: "settled by the proxy: " + got.evidence,
		// Upstream's answer is about the attempt v names: never record it against a later one.
		IfToken: v.Token,
	}
	if got.outcome == residual.Succeeded {
		rp.Result = got.result
	}
	if _, err := s.p.ic.Resolve(bctx, rp); err != nil {
		// Another call may have settled it meanwhile: beginning again tells.
		s.p.log.Warn("toolfence proxy: could not record what upstream said about the earlier attempt", "key", v.Key, "tool", tool, "err", err)
		return got.evidence + "; recording it failed: " + err.Error(), true
	}
	s.p.log.Info("toolfence proxy: earlier attempt settled by upstream's answer", "key", v.Key, "tool", tool, "as", got.outcome.String())
	return got.evidence, true
}

// notFoundTooSoon says why a probe's "not found" cannot settle the earlier attempt of v yet
// (empty when it can): the attempt began less than the probe's not_found_after (default:
// the tool's timeout) ago on the interceptor's clock, or its start is not recorded.
func (s *session) notFoundTooSoon(v *interceptor.Violation, pr *policy.ProbeRule, timeout time.Duration) string {
	after := cmpDur(pr.NotFoundAfter, timeout)
	if v.Since.IsZero() {
		return "the earlier attempt's start is not recorded, so it may still be running upstream; check upstream, then toolfence resolve"
	}
	from := v.Since.Add(after)
	if s.p.ic.Settings().Clock.Now().Before(from) {
		return fmt.Sprintf("the earlier attempt may still be running upstream; a probe's not-found is trusted from %s (its start %s + not_found_after %v)",
			from.UTC().Format(time.RFC3339Nano), v.Since.UTC().Format(time.RFC3339Nano), after)
	}
	return ""
}

// probe calls the probe tool with arguments taken from args and reads its found pointer.
func (s *session) probe(ctx context.Context, pr *policy.ProbeRule, args json.RawMessage) settlement {
	open := func(format string, a ...any) settlement {
		return settlement{outcome: residual.Unknown, evidence: fmt.Sprintf("probe %s: ", pr.Tool) + fmt.Sprintf(format, a...)}
	}
	pargs := map[string]any{}
	for _, name := range slices.Sorted(maps.Keys(pr.Arguments)) {
		v, ok, err := jsonptr.Lookup(pr.Arguments[name], args)
		if err != nil || !ok {
			return open("argument %q: JSON pointer %q is not in the call's arguments", name, pr.Arguments[name])
		}
		pargs[name] = v
	}
	params, err := json.Marshal(map[string]any{"name": pr.Tool, "arguments": pargs})
	if err != nil {
		return open("%v", err)
	}
	resp, err := s.roundTrip(ctx, "tools/call", params)
	if err != nil {
		return open("no answer: %v; outcome still unknown", err)
	}
	if resp.Error != nil {
		return open("JSON-RPC error: %v; outcome still unknown", resp.Error)
	}
	var result struct {
		IsError           bool            `json:"isError"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		Content           []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	}
	if err := json.Unmarshal(resp.Result, &result); err != nil {
		return open("its result is not a tool result: %v", err)
	}
	if result.IsError {
		return open("answered isError: %s; outcome still unknown", truncate(string(resp.Result), 200))
	}
	doc := result.StructuredContent
	if len(doc) == 0 || string(doc) == "null" {
		doc = nil
		for _, c := range result.Content {
			if c.Type == "text" {
				doc = json.RawMessage(c.Text)
				break
			}
		}
	}
	if doc == nil || !json.Valid(doc) {
		return open("its result has no structuredContent and no text block that is JSON; outcome still unknown")
	}
	v, ok, err := jsonptr.Lookup(pr.Found, doc)
	if err != nil || !ok {
		return open("found %q is not in its result; outcome still unknown", pr.Found)
	}
	shown, _ := json.Marshal(v)
	call := fmt.Sprintf("probe %s %s answered found %s = %s", pr.Tool, mustJSON(pargs), pr.Found, shown)
	if truthy(v) {
		return settlement{outcome: residual.Succeeded, result: resp.Result, evidence: call + ": the earlier attempt took effect (the probe's result is recorded as its result)"}
	}
	return settlement{outcome: residual.Failed, evidence: call + ": the earlier attempt had no effect"}
}

// truthy says whether a found value means the effect happened: true, a non-empty string,
// array or object, a non-zero number.
func truthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case string:
		return t != ""
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		return err != nil || f != 0
	case []any:
		return len(t) > 0
	case map[string]any:
		return len(t) > 0
	}
	return true
}

// withKey returns the tools/call params to send upstream with toolfence's key in the place
// the rule names: a top-level argument, or a params._meta field. A nil rule returns params.
func withKey(params json.RawMessage, k *policy.KeyRule, key string) (json.RawMessage, error) {
	if k == nil {
		return params, nil
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(params, &doc); err != nil || doc == nil {
		return nil, errors.New("tools/call params are not a JSON object")
	}
	field, name := "_meta", k.Meta
	if k.Argument != "" {
		field, name = "arguments", k.Argument
	}
	var obj map[string]json.RawMessage
	if raw, ok := doc[field]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("params.%s is not a JSON object", field)
		}
	}
	if obj == nil {
		obj = map[string]json.RawMessage{}
	}
	obj[name], _ = json.Marshal(key)
	doc[field], _ = json.Marshal(obj)
	return json.Marshal(doc)
}

// withNote adds a text block with what upstream said about an earlier attempt to an isError
// result the proxy made (unchanged when note is empty).
func withNote(result json.RawMessage, note string) json.RawMessage {
	if note == "" {
		return result
	}
	var doc map[string]json.RawMessage
	if json.Unmarshal(result, &doc) != nil {
		return result
	}
	var content []json.RawMessage
	_ = json.Unmarshal(doc["content"], &content)
	block, _ := json.Marshal(textBlock("toolfence asked upstream about the earlier attempt: " + note))
	doc["content"], _ = json.Marshal(append(content, block))
	out, err := json.Marshal(doc)
	if err != nil {
		return result
	}
	return out
}

// pinRefusal is the text of a call refused by its pin status.
func pinRefusal(tool, status string) string {
	why := map[string]string{
		"missing":  "has no pin",
		"changed":  "differs from its pin (the upstream changed it since it was locked)",
		"unlisted": "is no longer listed by the upstream",
	}[status]
	return fmt.Sprintf("refused: the definition of tool %s %s, and a changed description or schema can change what a call means; "+
		"nothing was sent upstream; calls of it are refused until a person reviews the definition and runs `toolfence proxy lock` to pin it again", tool, why)
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
