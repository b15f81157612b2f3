package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// pinsErr is every error about pins: malformed, an unknown key, a bad digest, or pins of
// another server. Its text is "mcpproxy: invalid pins: " and the detail; it wraps
// interceptor.ErrInvalidOptions.
func pinsErr(format string, args ...any) error {
	return interceptor.InvalidOptions("mcpproxy: invalid pins", format, args...)
}

var serverIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckServerID returns an error when id is not a valid server id (mcpproxy.Options.ServerID,
// Pins.ServerID): 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit.
func CheckServerID(id string) error {
	if !serverIDPattern.MatchString(id) {
		return fmt.Errorf("mcpproxy: server id %q: want 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", id)
	}
	return nil
}

var pinPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Pins are the catalog pins of one upstream server (`toolfence proxy lock` writes them): the
// digest of each tool's definition as upstream listed it. A protected tool whose definition
// no longer has its digest, or that has no pin, is refused until it is locked again: a
// changed description or schema can change what a call means.
type Pins struct {
	// ServerID is the --server-id the pins were taken for.
	ServerID string `json:"server_id"`
	// Tools maps each tool name to ToolDigest of its definition.
	Tools map[string]string `json:"tools"`
}

// ToolDigest returns the pin of a tool definition: "sha256:" and the hex SHA-256 of the
// canonical JSON of the whole tool object as upstream lists it (so key order and number
// spelling do not matter, every other change does). It returns an error for invalid JSON.
func ToolDigest(def json.RawMessage) (string, error) {
	d, err := residual.Digest(def)
	if err != nil {
		return "", err
	}
	return "sha256:" + d, nil
}

// Lock returns the pins of tools for serverID. It returns an error for a malformed server
// id, a tool without a name or listed twice, or a definition that is not JSON.
func Lock(serverID string, tools []Tool) (*Pins, error) {
	if err := CheckServerID(serverID); err != nil {
		return nil, err
	}
	p := &Pins{ServerID: serverID, Tools: map[string]string{}}
	for _, t := range tools {
		if t.Name == "" {
			return nil, errors.New("mcpproxy: the upstream lists a tool without a name")
		}
		if _, dup := p.Tools[t.Name]; dup {
			return nil, fmt.Errorf("mcpproxy: the upstream lists tool %q twice", t.Name)
		}
		d, err := ToolDigest(t.Definition)
		if err != nil {
			return nil, fmt.Errorf("mcpproxy: tool %q: %w", t.Name, err)
		}
		p.Tools[t.Name] = d
	}
	return p, nil
}

// ParsePins parses a pins document (JSON). It refuses unknown keys, trailing data, a
// missing or malformed server_id, a missing tools object, and a digest that is not
// "sha256:" and 64 hex digits; every error wraps interceptor.ErrInvalidOptions.
func ParsePins(data []byte) (*Pins, error) {
	var p Pins
	if err := decodeStrict(data, &p, "pins", pinsErr); err != nil {
		return nil, err
	}
	if !serverIDPattern.MatchString(p.ServerID) {
		return nil, pinsErr("server_id %q: want the --server-id the pins were locked for", p.ServerID)
	}
	if p.Tools == nil {
		return nil, pinsErr("no \"tools\" object")
	}
	for _, name := range sortedKeys(p.Tools) {
		if !pinPattern.MatchString(p.Tools[name]) {
			return nil, pinsErr("tool %q: pin %q: want \"sha256:\" and 64 lowercase hex digits", name, p.Tools[name])
		}
	}
	return &p, nil
}

// CheckServer returns nil when the pins were locked for serverID, else an error wrapping
// interceptor.ErrInvalidOptions that names both ids and how to lock this server's own.
func (p *Pins) CheckServer(serverID string) error {
	if p.ServerID != serverID {
		return pinsErr("the pins were locked for server %q, not %q: check --server-id, or give this server its own pins file (toolfence proxy lock --server-id %s --pins FILE)", p.ServerID, serverID, serverID)
	}
	return nil
}

// Pinned returns the pin of a tool and whether it has one (false for nil Pins).
func (p *Pins) Pinned(name string) (string, bool) {
	if p == nil {
		return "", false
	}
	pin, ok := p.Tools[name]
	return pin, ok
}

// Status says whether a tool's definition (info nil: upstream does not list it) matches its
// pin: "ok", "missing" (no pin), "changed" (another digest) or "unlisted" (pinned, but
// upstream no longer lists it). p must not be nil.
func (p *Pins) Status(name string, info *ToolInfo) string {
	pin, ok := p.Tools[name]
	switch {
	case info == nil && ok:
		return "unlisted"
	case !ok:
		return "missing"
	case pin != info.digest:
		return "changed"
	}
	return "ok"
}
