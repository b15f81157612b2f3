package transport

import "syscall"

// upstreamAttr puts the child in its own process group and has the kernel SIGKILL it when
// the thread that started it ends: a proxy killed outright takes its upstream along. The
// thread is the one StartUpstream's waiting goroutine is locked to until the child exits.
func upstreamAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
