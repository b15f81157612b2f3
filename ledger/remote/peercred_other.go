//go:build !linux

package remote

import "net"

// checkPeer trusts the socket file's checks where SO_PEERCRED is not read (off Linux).
func checkPeer(string, net.Conn) error { return nil }
