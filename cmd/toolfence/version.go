package main

import (
	"runtime/debug"
	"strings"
)

// buildVersion returns the version of this binary, from its build information: the module
// version when it was built by `go install …@vX` (or as a tagged dependency), else the
// commit it was built from (a pseudo-version, or "devel-" and 12 hex digits of the VCS
// revision, "+dirty" when the tree had changes), else "devel" (no build information).
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return versionOf(bi)
}

// versionOf is buildVersion over given build information.
func versionOf(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	v := "devel-" + rev[:min(len(rev), 12)]
	if dirty {
		v += "+dirty"
	}
	return strings.TrimSpace(v)
}
