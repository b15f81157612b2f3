package mcpproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// pinsErr is every error about a pins file: unreadable, malformed, an unknown
// key, a bad digest, or pins of another server.
// Its text is "mcpproxy: invalid pins: " and the detail; it wraps
// interceptor.ErrInvalidOptions.
func pinsErr(format string, args ...any) error {
	return interceptor.InvalidOptions("mcpproxy: invalid pins", format, args...)
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
	if !serverIDPattern.MatchString(serverID) {
		return nil, fmt.Errorf("mcpproxy: server id %q: want 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", serverID)
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

// LoadPins reads the pins file at path (see ParsePins). Its errors wrap interceptor.ErrInvalidOptions and name the
// file.
func LoadPins(path string) (*Pins, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, pinsErr("%w", err)
	}
	p, err := ParsePins(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePins parses a pins document (JSON). It refuses unknown keys, trailing data, a
// missing or malformed server_id, a missing tools object, and a digest that is not
// "sha256:" and 64 hex digits; every error wraps interceptor.ErrInvalidOptions.
func ParsePins(data []byte) (*Pins, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Pins
	if err := dec.Decode(&p); err != nil {
		return nil, pinsErr("%w", err)
	}
	if dec.More() {
		return nil, pinsErr("trailing data after the pins object")
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

// WritePins writes p to path atomically: a temporary file in the same folder, fsynced, then
// renamed over path (and the folder fsynced), so a reader sees the old pins or the new ones,
// never a part. On error nothing is left at path that was not there before.
func WritePins(path string, p *Pins) error {
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("mcpproxy: writing pins: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("mcpproxy: writing pins %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// DefaultPinsPath returns the pins file that goes with a policy file: the policy's path with
// its extension replaced by ".pins.json" (proxy.yaml → proxy.pins.json). It returns "" for
// an empty path.
func DefaultPinsPath(policyPath string) string {
	if policyPath == "" {
		return ""
	}
	return strings.TrimSuffix(policyPath, filepath.Ext(policyPath)) + ".pins.json"
}

// pinned returns the pin of a tool and whether it has one (false for nil pins).
func (p *Pins) pinned(name string) (string, bool) {
	if p == nil {
		return "", false
	}
	pin, ok := p.Tools[name]
	return pin, ok
}

// pinStatus says whether a tool's definition matches its pin: "ok", "missing" (no pin),
// "changed" (another digest) or "unlisted" (pinned, but upstream no longer lists it).
func (p *Pins) status(name string, info *toolInfo) string {
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
