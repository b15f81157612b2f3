//go:build !linux

package transport

import "syscall"

// upstreamAttr puts the child in its own process group. (No parent-death signal here: a
// proxy killed outright leaves its upstream to notice the end of its stdin.)
func upstreamAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
