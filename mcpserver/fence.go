package mcpserver

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Who may commit or renew an attempt begun over MCP.
//
// Fencing tokens are small, sequential and shown to every client of the namespace
// (list_pending, inspect_residual, blocked decisions), so a token alone proves nothing. A
// proceed decision therefore hands its caller a lease secret: 128 random bits, returned
// once and stored nowhere. The attempt's holder is recorded as NAME#HASH, HASH being the
// first holderHashLen hex digits of the secret's SHA-256. commit_call and renew_lease
// require the secret and rebuild the holder from the attempt's NAME and the hash of the
// secret given; the ledger's fence compares (key, holder, token) atomically, so a caller
// without the secret can neither settle another holder's attempt (which would let the key
// dispatch again) nor keep it alive.
const (
	leaseSecretBytes = 16
	holderHashLen    = 32
)

// newLeaseSecret returns a fresh lease secret in lowercase hex.
func newLeaseSecret() string {
	var b [leaseSecretBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// secretHash is the part of a holder that stands for secret.
func secretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])[:holderHashLen]
}

// holderOf is the holder recorded for an attempt of name under secret.
func holderOf(name, secret string) string { return name + "#" + secretHash(secret) }

// validSecret reports whether s has the form of a lease secret.
func validSecret(s string) bool {
	if len(s) != 2*leaseSecretBytes {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func (c *check) secret(s string) {
	switch {
	case s == "":
		c.fail("lease_secret is required (the lease_secret begin_call returned with proceed)")
	case !validSecret(s):
		c.fail("lease_secret must be the %d lowercase hex digits begin_call returned", 2*leaseSecretBytes)
	}
}

// recoveryNotHolder is the recovery of a commit or renewal whose lease_secret does not
// prove the caller is the attempt's holder.
const recoveryNotHolder = "only the caller that received the lease_secret from begin_call may commit or renew this attempt; " +
	"do not perform or settle the call: wait for its holder, or for the lease to expire and then reconcile or " +
	"resolve_residual (inspect_residual shows it)"

// errNotHolder is wrapped by the refusals of holds.
var errNotHolder = errors.New("mcpserver: not the holder")

// holds returns the proof interceptor.Resume asks for: the recorded holder must have begun
// over MCP (NAME#HASH) and HASH must be the hash of secret. The comparison takes constant
// time. It writes nothing.
func holds(secret string) func(recordedHolder string) error {
	return func(h string) error {
		i := strings.LastIndexByte(h, '#')
		if i < 0 || len(h)-i-1 != holderHashLen {
			return fmt.Errorf("%w: the attempt is held by %s, which did not begin the call over MCP and has no lease_secret", errNotHolder, h)
		}
		if subtle.ConstantTimeCompare([]byte(h[i+1:]), []byte(secretHash(secret))) != 1 {
			return fmt.Errorf("%w: lease_secret does not match the holder %s", errNotHolder, h)
		}
		return nil
	}
}
