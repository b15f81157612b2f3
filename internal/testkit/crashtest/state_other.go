//go:build !linux

package crashtest

// waitState cannot observe a stop or a continue without reaping outside Linux: the signal
// having been sent is all Stop and Continue promise there.
func waitState(pid int, stopped bool) error { return nil }
