package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
)

// Errorf returns an error about a policy (malformed, an unknown key, a bad value, a tool
// the upstream does not list, a policy file that cannot be read): its text is
// "mcpproxy: invalid policy: " and the detail formatted as fmt.Errorf does; it wraps
// interceptor.ErrInvalidOptions (the module's one sentinel of unusable settings) and every
// %w operand. Every error of this package about a policy is one.
func Errorf(format string, args ...any) error {
	return interceptor.InvalidOptions(errPrefix, format, args...)
}

// errPrefix starts the text of every error about a policy (then ": " and the detail).
const errPrefix = "mcpproxy: invalid policy"

// codeUpstreamHTTP is transport.CodeUpstreamHTTP (a test holds them equal): the proxy's
// own answer when an HTTP upstream gave none, which never proves no effect.
// oldCodeUpstreamHTTP is the code older proxies gave that answer (one may be the upstream of
// this one): it never proves no effect either.
const (
	codeUpstreamHTTP    = -32010
	oldCodeUpstreamHTTP = -32099
)

// Modes of a tool in the policy.
const (
	// Protect puts every call of the tool through the barrier.
	Protect = "protect"
	// Bypass forwards the tool's calls untouched (read-only tools).
	Bypass = "bypass"
)

// Policy is the proxy's policy file, JSON or YAML (docs/proxy-policy.example.yaml):
//
//	tools:
//	  charge:
//	    mode: protect
//	    target: ["/order_id"]
//	    lease: 30s
//	    timeout: 2m
//	    no_effect: {codes: [-32000], patterns: ["^card declined"]}
//	    probe: {tool: find_charge, arguments: {order_id: /order_id}, found: /found}
//	    key: {argument: idempotency_key}
//	  search:
//	    mode: bypass
//
// The zero Policy is valid: read-only tools (annotation readOnlyHint: true) are bypassed,
// every other tool is protected with the digest of its arguments as target.
type Policy struct {
	// Tools holds the rules per upstream tool name.
	Tools map[string]Rule `json:"tools"`
}

// Rule is the rule of one tool.
type Rule struct {
	// Mode is "protect" or "bypass". Empty: bypass when the tool is annotated
	// readOnlyHint: true, else protect. A bypass is overridden (protect) when the tool is
	// annotated destructiveHint: true: annotations only ever make a tool stricter.
	Mode string `json:"mode"`
	// Target lists RFC 6901 JSON pointers into the call's arguments whose values name the
	// thing mutated. Empty: the digest of the canonical arguments, so a re-worded retry is a
	// new target (it is not recognised as the same intent).
	Target []string `json:"target"`
	// Lease is the lease of each attempt ("30s"). Defaults to the interceptor's.
	Lease Duration `json:"lease"`
	// Timeout bounds how long the proxy waits for upstream's answer; then the outcome is
	// unknown. Defaults to mcpproxy.Options.Timeout.
	Timeout Duration `json:"timeout"`
	// NoEffect lists the answers that prove upstream did nothing (recorded failed, so a
	// retry dispatches again).
	NoEffect NoEffect `json:"no_effect"`
	// Probe, when set, asks upstream what became of an attempt whose outcome is unknown, so
	// the next call settles it instead of being refused. Nil: such calls stay refused until
	// the key is resolved by hand.
	Probe *ProbeRule `json:"probe"`
	// Key, when set, says that upstream deduplicates by a key and where to send toolfence's
	// key; an attempt whose outcome is unknown is then dispatched again under the same key.
	Key *KeyRule `json:"key"`
	// Repeats says what a call identical to one that succeeded is, when the call names no
	// task (docs/proxy.md "The same call again"): RepeatsWindow (the default without target
	// and key), RepeatsReplay (the default with either) or RepeatsSend.
	Repeats string `json:"repeats"`
	// RepeatWindow is the window of RepeatsWindow ("10m"). Defaults to
	// mcpproxy.Options.RepeatWindow.
	RepeatWindow Duration `json:"repeat_window"`
}

// The values of Rule.Repeats: what an identical call is once the earlier one succeeded.
const (
	// RepeatsWindow: a retry (answered from the ledger, nothing sent) while the host may not
	// have had the earlier answer; once it had it, a new intent (sent again) when a call of
	// the same tool began after it or the window has passed since; within the window, the
	// host's user is asked whether to run it again (elicitation), else it is answered from
	// the ledger saying that nothing was sent.
	RepeatsWindow = "window"
	// RepeatsReplay: always answered from the ledger (the target, or upstream's own key,
	// names the intent).
	RepeatsReplay = "replay"
	// RepeatsSend: a new intent as soon as the host had the earlier answer.
	RepeatsSend = "send"
)

// RepeatMode is the rule's Repeats with its default: RepeatsReplay for a rule with a target
// or a key, RepeatsWindow otherwise.
func (r Rule) RepeatMode() string {
	switch {
	case r.Repeats != "":
		return r.Repeats
	case len(r.Target) > 0 || r.Key != nil:
		return RepeatsReplay
	}
	return RepeatsWindow
}

// ProbeRule is the probe of a protected tool: another upstream tool, called with arguments
// taken from the call, whose result says whether the call's effect happened.
type ProbeRule struct {
	// Tool is the upstream tool to call (a read; it must be listed upstream and must not be
	// the protected tool itself). Required.
	Tool string `json:"tool"`
	// Arguments maps each argument of the probe to an RFC 6901 JSON pointer into the
	// protected call's arguments.
	Arguments map[string]string `json:"arguments"`
	// Found is a JSON pointer into the probe's result (its structuredContent, else its first
	// text block parsed as JSON). A value true, a non-empty string, array or object, or a
	// non-zero number means the effect happened; false, null, "", 0, [] or {} that it did
	// not; an absent value leaves the outcome unknown. Required.
	Found string `json:"found"`
	// NotFoundAfter is how long after an attempt began a "not found" of the probe is
	// trusted to mean that attempt had no effect ("2m"). Sooner, the attempt may still be
	// running upstream (it timed out, was cancelled, or the proxy was killed, but upstream
	// may act later), so the call stays refused. Defaults to the tool's timeout (the
	// policy's timeout, else mcpproxy.Options.Timeout). "Found" settles at once.
	NotFoundAfter Duration `json:"not_found_after"`
}

// KeyRule says where the proxy puts toolfence's idempotency key in the request it sends
// upstream. Exactly one field is set.
type KeyRule struct {
	// Argument is the name of a top-level argument that gets the key (set after the target
	// and the digest were computed on the host's own arguments; a value the host sent for it
	// is replaced).
	Argument string `json:"argument"`
	// Meta is the name of a params._meta field that gets the key.
	Meta string `json:"meta"`
}

// NoEffect are answers of a tool that prove it had no effect.
type NoEffect struct {
	// Codes are JSON-RPC error codes (besides -32601 method not found and -32602 invalid
	// params, which always count, but for the TypeScript SDK's refusal of a tool's output,
	// given after the tool ran: docs/proxy.md).
	Codes []int64 `json:"codes"`
	// Patterns are regular expressions (RE2) matched against the text content of an
	// isError: true result; one match proves no effect.
	Patterns []string `json:"patterns"`

	res []*regexp.Regexp
}

// Duration is a time.Duration written as a Go duration string ("30s", "2m").
type Duration time.Duration

// UnmarshalJSON parses a duration string; numbers are refused (their unit would be a guess).
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"30s\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	*d = Duration(v)
	return nil
}

// Parse parses a policy document, JSON (ParseJSON) when its first non-blank byte is '{'
// and YAML (ParseYAML) otherwise. Both are held to the same rules: it refuses unknown keys at any level, trailing
// data (a second YAML document), a mode other than protect or bypass, a bad JSON pointer or
// pattern, no_effect code -32010 (transport.CodeUpstreamHTTP) or -32099 (its value in older proxies), a probe without tool or found (or naming the tool itself), a key with neither or
// both of argument and meta, and target, no_effect, probe or key on a bypassed tool (they
// would never apply); every error wraps interceptor.ErrInvalidOptions and
// names the tool.
func Parse(data []byte) (*Policy, error) {
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return ParseJSON(data)
	}
	return ParseYAML(data)
}

// ParseYAML parses a YAML policy (JSON is YAML too) by turning it into JSON for ParseJSON,
// so both forms meet one decoder and one set of rules. It refuses an empty document, a
// second document and one that is not a mapping; its errors are those of Parse.
func ParseYAML(data []byte) (*Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, Errorf("the policy is empty (want a mapping with \"tools\")")
		}
		return nil, Errorf("YAML: %w", err)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return nil, Errorf("trailing data after the policy (a second YAML document)")
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, Errorf("YAML: the policy must be a mapping with \"tools\", not %T", doc)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, Errorf("YAML: %w (keys must be strings)", err)
	}
	return ParseJSON(js)
}

// ParseJSON parses a JSON policy under the rules of Parse (a YAML document is refused). On
// error it returns nil and an error wrapping interceptor.ErrInvalidOptions.
func ParseJSON(data []byte) (*Policy, error) {
	var ke *keyError
	if err := checkKeys(data); errors.As(err, &ke) {
		return nil, Errorf("%w", err)
	}
	var p Policy
	if err := decodeStrict(data, &p, "policy", Errorf); err != nil {
		return nil, err
	}
	for _, name := range p.Names() {
		tp := p.Tools[name]
		bad := func(format string, args ...any) error {
			return Errorf("tool %q: %s", name, fmt.Sprintf(format, args...))
		}
		switch tp.Mode {
		case "", Protect:
		case Bypass:
			if len(tp.Target) > 0 || len(tp.NoEffect.Codes) > 0 || len(tp.NoEffect.Patterns) > 0 || tp.Probe != nil || tp.Key != nil ||
				tp.Repeats != "" || tp.RepeatWindow != 0 {
				return nil, bad("mode bypass takes no target, no_effect, probe, key, repeats or repeat_window (a bypassed call is not recorded)")
			}
		default:
			return nil, bad("mode %q: want %q or %q", tp.Mode, Protect, Bypass)
		}
		if name == "" {
			return nil, Errorf("a tool has an empty name")
		}
		for _, ptr := range tp.Target {
			if err := jsonptr.Check(ptr); err != nil {
				return nil, bad("target: %v", err)
			}
		}
		for _, code := range tp.NoEffect.Codes {
			if code == codeUpstreamHTTP || code == oldCodeUpstreamHTTP {
				return nil, bad("no_effect code %d is the proxy's own answer when an HTTP upstream gave none, so the call may have run: it never proves no effect (the proxy already records a request that was never sent as failed)", code)
			}
		}
		for _, pat := range tp.NoEffect.Patterns {
			re, err := regexp.Compile(pat)
			if err != nil {
				return nil, bad("no_effect pattern: %v", err)
			}
			tp.NoEffect.res = append(tp.NoEffect.res, re)
		}
		if pr := tp.Probe; pr != nil {
			switch {
			case pr.Tool == "":
				return nil, bad("probe: tool is required (the upstream tool that looks the effect up)")
			case pr.Tool == name:
				return nil, bad("probe: tool %q is the protected tool itself; a probe must be another tool that only reads", name)
			case pr.Found == "":
				return nil, bad("probe: found is required (a JSON pointer into the probe's result, e.g. /found)")
			}
			if err := jsonptr.Check(pr.Found); err != nil {
				return nil, bad("probe found: %v", err)
			}
			for _, arg := range sortedKeys(pr.Arguments) {
				if arg == "" {
					return nil, bad("probe arguments: an argument has an empty name")
				}
				if err := jsonptr.Check(pr.Arguments[arg]); err != nil {
					return nil, bad("probe argument %q: %v", arg, err)
				}
			}
		}
		if k := tp.Key; k != nil && (k.Argument == "") == (k.Meta == "") {
			return nil, bad("key: set exactly one of argument (an argument name) or meta (a _meta field name)")
		}
		switch tp.Repeats {
		case "", RepeatsReplay:
		case RepeatsWindow, RepeatsSend:
			if tp.Key != nil {
				return nil, bad("repeats %q with key: upstream deduplicates by toolfence's key, which a new intent shares, so it would answer the earlier call again; leave repeats %q", tp.Repeats, RepeatsReplay)
			}
		default:
			return nil, bad("repeats %q: want %q, %q or %q", tp.Repeats, RepeatsWindow, RepeatsReplay, RepeatsSend)
		}
		if tp.RepeatWindow != 0 && tp.RepeatMode() != RepeatsWindow {
			return nil, bad("repeat_window applies to repeats %q only (this tool's is %q)", RepeatsWindow, tp.RepeatMode())
		}
		p.Tools[name] = tp
	}
	return &p, nil
}

// CheckLeases returns an error wrapping interceptor.ErrInvalidOptions, naming the tool, when
// a tool's lease is not longer than margin (the interceptor's safety margin: such an attempt
// could never be dispatched), else nil. mcpproxy.New checks it; a caller can check it before
// it opens a store.
func (p *Policy) CheckLeases(margin time.Duration) error {
	for _, name := range p.Names() {
		if l := time.Duration(p.Tools[name].Lease); l != 0 && l <= margin {
			return Errorf("tool %q: lease %v is not longer than the safety margin %v", name, l, margin)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Names returns the names of the tools the policy has rules for, sorted.
func (p *Policy) Names() []string { return sortedKeys(p.Tools) }

// CheckCatalog returns an error wrapping interceptor.ErrInvalidOptions naming the first
// tool of the policy, or the first probe tool, that cat (the upstream's tools by name, of
// server serverID) does not list; nil when it lists them all.
func (p *Policy) CheckCatalog(serverID string, cat map[string]ToolInfo) error {
	listed := func() string {
		names := sortedKeys(cat)
		return strings.Join(names, ", ")
	}
	for _, name := range p.Names() {
		if _, ok := cat[name]; !ok {
			return Errorf("the policy names tool %q, which server %q does not list (it lists: %s)", name, serverID, listed())
		}
	}
	for _, name := range p.Names() {
		if pr := p.Tools[name].Probe; pr != nil {
			if _, ok := cat[pr.Tool]; !ok {
				return Errorf("tool %q: its probe tool %q is not listed by server %q (it lists: %s)", name, pr.Tool, serverID, listed())
			}
		}
	}
	return nil
}

// ToolInfo is what the proxy needs of an upstream tool definition (ParseTool makes it).
type ToolInfo struct {
	// Name is the tool's name, never "" (ParseTool refuses that).
	Name string `json:"name"`
	// Annotations are the tool's hints; nil when it has none.
	Annotations *struct {
		ReadOnlyHint    *bool `json:"readOnlyHint"`
		DestructiveHint *bool `json:"destructiveHint"`
	} `json:"annotations"`
	// InputSchema.Properties are the arguments the tool declares (none: it declares none).
	InputSchema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	} `json:"inputSchema"`

	// digest is the pin digest of the definition as upstream listed it (ToolDigest).
	digest string
}

// Digest returns the pin of the definition as upstream listed it (ToolDigest); "" for a
// ToolInfo that ParseTool did not make.
func (t ToolInfo) Digest() string { return t.digest }

// ParseTool reads one tool definition as upstream listed it. It returns an error for a
// definition that is not a JSON object or has no name.
func ParseTool(raw json.RawMessage) (ToolInfo, error) {
	var t ToolInfo
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("a tool definition is not a JSON object: %w", err)
	}
	if t.Name == "" {
		return t, errors.New("a tool definition has no name")
	}
	d, err := ToolDigest(raw)
	if err != nil {
		return t, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	t.digest = d
	return t, nil
}

// MissingArguments returns the target and probe-argument pointers of rule whose first token
// names no property of the tool's inputSchema; nil when all do, or the schema lists no
// properties.
func (t ToolInfo) MissingArguments(rule Rule) []string {
	if len(t.InputSchema.Properties) == 0 {
		return nil
	}
	var missing []string
	check := func(ptr string) {
		tok, _, _ := strings.Cut(strings.TrimPrefix(ptr, "/"), "/")
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		if _, ok := t.InputSchema.Properties[tok]; !ok && ptr != "" {
			missing = append(missing, ptr)
		}
	}
	for _, ptr := range rule.Target {
		check(ptr)
	}
	if rule.Probe != nil {
		for _, arg := range sortedKeys(rule.Probe.Arguments) {
			check(rule.Probe.Arguments[arg])
		}
	}
	return missing
}

// Decision is what the proxy does with calls of one tool.
type Decision struct {
	// Protect is true when the tool's calls go through the barrier, false when they bypass it.
	Protect bool
	// Rule is the policy's rule of the tool (the zero Rule when the policy names it not).
	Rule Rule
	// Why explains the decision (for logs and `proxy check`).
	Why string
}

// Decide applies the policy and the tool's annotations (info nil: the tool is not in the
// catalog, which protects it). It always decides: annotations only ever make a tool stricter.
func (p *Policy) Decide(name string, info *ToolInfo) Decision {
	rule, inFile := p.Tools[name]
	readOnly, destructive := false, false
	if info != nil && info.Annotations != nil {
		readOnly = info.Annotations.ReadOnlyHint != nil && *info.Annotations.ReadOnlyHint
		destructive = info.Annotations.DestructiveHint != nil && *info.Annotations.DestructiveHint
	}
	switch {
	case info == nil:
		return Decision{Protect: true, Rule: rule, Why: "not in the upstream's tool list"}
	case inFile && rule.Mode == Protect:
		return Decision{Protect: true, Rule: rule, Why: "policy: protect"}
	case inFile && rule.Mode == Bypass && destructive:
		return Decision{Protect: true, Rule: rule, Why: "policy says bypass, but the tool is annotated destructiveHint: true (annotations only make a tool stricter)"}
	case inFile && rule.Mode == Bypass:
		return Decision{Rule: rule, Why: "policy: bypass"}
	case readOnly:
		return Decision{Rule: rule, Why: "annotated readOnlyHint: true"}
	}
	return Decision{Protect: true, Rule: rule, Why: "default: not annotated read-only"}
}

// ExplicitBypass reports whether the policy itself names the tool with mode bypass (not
// merely an annotation): such a tool is bypassed without a pin check.
func (p *Policy) ExplicitBypass(name string) bool {
	rule, ok := p.Tools[name]
	return ok && rule.Mode == Bypass
}

// Matches reports whether an isError result's text matches one of the patterns; false for
// a NoEffect that Parse did not make (its patterns are compiled there).
func (n NoEffect) Matches(text string) bool {
	for _, re := range n.res {
		if re.MatchString(text) {
			return true
		}
	}
	return false
}

// HasCode reports whether code is one of the no-effect codes.
func (n NoEffect) HasCode(code int64) bool {
	for _, c := range n.Codes {
		if c == code {
			return true
		}
	}
	return false
}
