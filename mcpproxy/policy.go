package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/toolfence/toolfence/tools"
)

// ErrPolicy is wrapped by every error about a policy file: unreadable, malformed, an unknown
// key, a bad value, or a tool the upstream does not list.
var ErrPolicy = errors.New("mcpproxy: invalid policy")

// Modes of a tool in the policy.
const (
	// Protect puts every call of the tool through the barrier.
	Protect = "protect"
	// Bypass forwards the tool's calls untouched (read-only tools).
	Bypass = "bypass"
)

// Policy is the proxy's policy file (JSON):
//
//	{"tools": {
//	  "send_email": {"mode": "protect", "target": ["/to"], "lease": "30s", "timeout": "2m",
//	                 "no_effect": {"codes": [-32000], "patterns": ["^invalid address"]}},
//	  "search":     {"mode": "bypass"}}}
//
// The zero Policy is valid: read-only tools (annotation readOnlyHint: true) are bypassed,
// every other tool is protected with the digest of its arguments as target.
type Policy struct {
	// Tools holds the rules per upstream tool name.
	Tools map[string]ToolPolicy `json:"tools"`
}

// ToolPolicy is the rule of one tool.
type ToolPolicy struct {
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
	// unknown. Defaults to Options.Timeout.
	Timeout Duration `json:"timeout"`
	// NoEffect lists the answers that prove upstream did nothing (recorded failed, so a
	// retry dispatches again).
	NoEffect NoEffect `json:"no_effect"`
}

// NoEffect are answers of a tool that prove it had no effect.
type NoEffect struct {
	// Codes are JSON-RPC error codes (besides -32601 method not found and -32602 invalid
	// params, which always count).
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

// LoadPolicy reads and parses the policy file at path (see ParsePolicy). Its errors wrap
// ErrPolicy and name the file.
func LoadPolicy(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy parses a policy document. It refuses unknown keys, trailing data, a mode
// other than protect or bypass, a bad JSON pointer or pattern, and target or no_effect on a
// bypassed tool (they would never apply); every error wraps ErrPolicy and names the tool.
func ParsePolicy(data []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the policy object", ErrPolicy)
	}
	for _, name := range p.names() {
		tp := p.Tools[name]
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: tool %q: %s", ErrPolicy, name, fmt.Sprintf(format, args...))
		}
		switch tp.Mode {
		case "", Protect:
		case Bypass:
			if len(tp.Target) > 0 || len(tp.NoEffect.Codes) > 0 || len(tp.NoEffect.Patterns) > 0 {
				return nil, bad("mode bypass takes no target or no_effect (a bypassed call is not recorded)")
			}
		default:
			return nil, bad("mode %q: want %q or %q", tp.Mode, Protect, Bypass)
		}
		if name == "" {
			return nil, fmt.Errorf("%w: a tool has an empty name", ErrPolicy)
		}
		for _, ptr := range tp.Target {
			if err := tools.CheckPointer(ptr); err != nil {
				return nil, bad("target: %v", err)
			}
		}
		for _, pat := range tp.NoEffect.Patterns {
			re, err := regexp.Compile(pat)
			if err != nil {
				return nil, bad("no_effect pattern: %v", err)
			}
			tp.NoEffect.res = append(tp.NoEffect.res, re)
		}
		p.Tools[name] = tp
	}
	return &p, nil
}

// names returns the policy's tool names, sorted.
func (p *Policy) names() []string {
	names := make([]string, 0, len(p.Tools))
	for n := range p.Tools {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// checkCatalog returns an error wrapping ErrPolicy naming the first tool of the policy that
// the upstream does not list.
func (p *Policy) checkCatalog(serverID string, cat map[string]toolInfo) error {
	for _, name := range p.names() {
		if _, ok := cat[name]; !ok {
			listed := make([]string, 0, len(cat))
			for n := range cat {
				listed = append(listed, n)
			}
			sort.Strings(listed)
			return fmt.Errorf("%w: the policy names tool %q, which server %q does not list (it lists: %s)",
				ErrPolicy, name, serverID, strings.Join(listed, ", "))
		}
	}
	return nil
}

// toolInfo is what the proxy needs of an upstream tool definition.
type toolInfo struct {
	Name        string `json:"name"`
	Annotations *struct {
		ReadOnlyHint    *bool `json:"readOnlyHint"`
		DestructiveHint *bool `json:"destructiveHint"`
	} `json:"annotations"`
}

// decision is what the proxy does with calls of one tool.
type decision struct {
	protect bool
	rule    ToolPolicy
	// why explains the decision (for logs and `proxy check`).
	why string
}

// decide applies the policy and the tool's annotations (info nil: the tool is not in the
// catalog, which protects it).
func (p *Policy) decide(name string, info *toolInfo) decision {
	rule, inFile := p.Tools[name]
	readOnly, destructive := false, false
	if info != nil && info.Annotations != nil {
		readOnly = info.Annotations.ReadOnlyHint != nil && *info.Annotations.ReadOnlyHint
		destructive = info.Annotations.DestructiveHint != nil && *info.Annotations.DestructiveHint
	}
	switch {
	case info == nil:
		return decision{protect: true, rule: rule, why: "not in the upstream's tool list"}
	case inFile && rule.Mode == Protect:
		return decision{protect: true, rule: rule, why: "policy: protect"}
	case inFile && rule.Mode == Bypass && destructive:
		return decision{protect: true, rule: rule, why: "policy says bypass, but the tool is annotated destructiveHint: true (annotations only make a tool stricter)"}
	case inFile && rule.Mode == Bypass:
		return decision{rule: rule, why: "policy: bypass"}
	case readOnly:
		return decision{rule: rule, why: "annotated readOnlyHint: true"}
	}
	return decision{protect: true, rule: rule, why: "default: not annotated read-only"}
}

// matchesNoEffect says whether an isError result's text matches one of the rule's patterns.
func (n NoEffect) matches(text string) bool {
	for _, re := range n.res {
		if re.MatchString(text) {
			return true
		}
	}
	return false
}

// hasCode says whether code is one of the rule's no-effect codes.
func (n NoEffect) hasCode(code int64) bool {
	for _, c := range n.Codes {
		if c == code {
			return true
		}
	}
	return false
}
