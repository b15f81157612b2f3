package policy

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Tool is one tool definition as an upstream server lists it.
type Tool struct {
	// Name is the tool's name.
	Name string
	// Definition is the whole tool object as upstream sent it.
	Definition json.RawMessage
}

// Report is what the proxy would do with each tool of an upstream (`toolfence proxy check`).
type Report struct {
	// Tools has one entry per tool the upstream lists, in its order.
	Tools []ToolReport
	// Problems are faults that refuse every call: a tool or probe tool the policy names that
	// the upstream does not list, pins taken for another server id.
	Problems []string
}

// ToolReport is the proxy's verdict on one upstream tool.
type ToolReport struct {
	// Name is the tool's name.
	Name string
	// Protect is the decision: true protect (through the barrier), false bypass.
	Protect bool
	// Why explains the decision (policy, annotation or default).
	Why string
	// Target is how keys get their target: the policy's pointers joined with ", ", or
	// "digest of arguments"; "" for a bypassed tool.
	Target string
	// Pin is "ok", "missing", "changed" or "unlisted" against the pins, "no pins" without
	// them; for a bypassed tool the status of its pin when it has one and the policy file
	// does not say bypass (such a tool is checked), else "".
	Pin string
	// Warnings are problems that do not refuse calls by themselves, and the reasons of
	// Refused.
	Warnings []string
	// Refused is true when every call of the tool would be refused, whatever its arguments.
	Refused bool
}

// Refused reports whether any call would be refused whatever its arguments: a problem, or
// a tool refused.
func (r *Report) Refused() bool {
	if len(r.Problems) > 0 {
		return true
	}
	for _, t := range r.Tools {
		if t.Refused {
			return true
		}
	}
	return false
}

// Check applies the policy (nil: the zero Policy) and the pins (nil: none) to the tools an
// upstream lists, as the proxy would, and reports per tool the decision, the target, the
// pin status and warnings: a digest target (a re-worded retry is not recognised), a target
// or probe-argument pointer that names no property of the tool's inputSchema (every call is
// refused unless the upstream accepts undeclared arguments), a pin missing or changed. It
// never fails: a definition it cannot read is one of the Report's Problems.
func Check(serverID string, pol *Policy, pins *Pins, list []Tool) *Report {
	if pol == nil {
		pol = &Policy{}
	}
	rep := &Report{}
	cat := map[string]ToolInfo{}
	var infos []ToolInfo
	for _, t := range list {
		info, err := ParseTool(t.Definition)
		if err != nil {
			rep.Problems = append(rep.Problems, err.Error())
			continue
		}
		cat[info.Name] = info
		infos = append(infos, info)
	}
	if err := pol.CheckCatalog(serverID, cat); err != nil {
		rep.Problems = append(rep.Problems, strings.TrimPrefix(err.Error(), errPrefix+": "))
	}
	if pins != nil && pins.ServerID != serverID {
		rep.Problems = append(rep.Problems, fmt.Sprintf("the pins were locked for server %q, not %q: run toolfence proxy lock", pins.ServerID, serverID))
	}
	for _, info := range infos {
		d := pol.Decide(info.Name, &info)
		tr := ToolReport{Name: info.Name, Protect: d.Protect, Why: d.Why}
		if !d.Protect {
			// A pinned tool is checked before it may be bypassed (as the proxy does).
			if _, pinned := pins.Pinned(info.Name); pinned && !pol.ExplicitBypass(info.Name) {
				if tr.Pin = pins.Status(info.Name, &info); tr.Pin != "ok" {
					tr.Refused = true
					tr.Warnings = append(tr.Warnings, fmt.Sprintf("pin %s: calls are refused until toolfence proxy lock (or the policy says mode: bypass)", tr.Pin))
				}
			}
			rep.Tools = append(rep.Tools, tr)
			continue
		}
		tr.Target = strings.Join(d.Rule.Target, ", ")
		if len(d.Rule.Target) == 0 {
			tr.Target = "digest of arguments"
			tr.Warnings = append(tr.Warnings, "no target pointers: the target is a digest of the arguments (a re-worded retry is not recognised as the same call)")
		}
		if miss := info.MissingArguments(d.Rule); len(miss) > 0 {
			tr.Refused = true
			tr.Warnings = append(tr.Warnings, fmt.Sprintf("pointer(s) %s name no property of the tool's inputSchema: calls without them are refused", strings.Join(miss, ", ")))
		}
		tr.Pin = "no pins"
		if pins != nil {
			tr.Pin = pins.Status(info.Name, &info)
			if tr.Pin != "ok" {
				tr.Refused = true
				tr.Warnings = append(tr.Warnings, fmt.Sprintf("pin %s: calls are refused until toolfence proxy lock", tr.Pin))
			}
		}
		rep.Tools = append(rep.Tools, tr)
	}
	return rep
}
