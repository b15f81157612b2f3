package mcpproxy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpproxy/policy"
)

// The files of the policy language: package policy parses bytes, these read and write them.

// LoadPolicy reads and parses the policy file at path: YAML when its name ends in .yaml or
// .yml, JSON when it ends in .json, else by its content (see policy.Parse). Its errors wrap
// interceptor.ErrInvalidOptions and name the file.
func LoadPolicy(path string) (*policy.Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, policy.Errorf("cannot read the policy file: %w", err)
	}
	var p *policy.Policy
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yaml", ".yml":
		p, err = policy.ParseYAML(data)
	case ".json":
		p, err = policy.ParseJSON(data)
	default:
		p, err = policy.Parse(data)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// LoadPins reads the pins file at path (see policy.ParsePins). Its errors wrap
// interceptor.ErrInvalidOptions and name the file.
func LoadPins(path string) (*policy.Pins, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, interceptor.InvalidOptions("mcpproxy: invalid pins", "%w", err)
	}
	p, err := policy.ParsePins(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// WritePins writes p to path atomically: a temporary file in the same folder, fsynced, then
// renamed over path (and the folder fsynced), so a reader sees the old pins or the new ones,
// never a part. On error nothing is left at path that was not there before.
func WritePins(path string, p *policy.Pins) error {
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
