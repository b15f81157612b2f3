// Package npmci installs the npm dependencies of the Node.js scripts that tests run (MCP hosts
// on the TypeScript SDK): `npm ci` at most once per directory and process, and only when the
// directory's package.json or package-lock.json changed since its last install. Test binaries
// of several packages may install the same directory at once: a file lock in it serializes them.
package npmci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// stamp, inside node_modules, holds the digest of the manifests the last install used.
const stamp = "node_modules/.toolfence-installed"

var (
	mu   sync.Mutex
	done = map[string]error{} // dir → result of its install in this process
)

// Install runs `npm ci` (npm is the npm binary) in dir, offline-first and without scripts,
// unless node_modules already matches dir's package.json and package-lock.json. It runs at
// most once per dir in a process and returns the same result to every caller; the error
// names the directory and carries npm's output.
func Install(npm, dir string) error {
	mu.Lock()
	defer mu.Unlock()
	if err, ok := done[dir]; ok {
		return err
	}
	err := install(npm, dir)
	done[dir] = err
	return err
}

func install(npm, dir string) error {
	unlock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("npm ci in %s: %w", dir, err)
	}
	defer unlock()
	h := sha256.New()
	for _, name := range []string{"package.json", "package-lock.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		h.Write(b)
	}
	want := hex.EncodeToString(h.Sum(nil))
	path := filepath.Join(dir, stamp)
	if got, err := os.ReadFile(path); err == nil && string(got) == want {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--prefer-offline", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("npm ci in %s: %w\n%s", dir, err, out)
	}
	return os.WriteFile(path, []byte(want), 0o644)
}
