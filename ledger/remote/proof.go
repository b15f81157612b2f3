package remote

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"

	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Proof of holding over the wire.
//
// Holders and fencing tokens are readable by every client of a namespace (get, list), so
// naming them proves nothing. A Client therefore makes a secret of its own (128 random bits,
// sent only as Proof on its own requests, stored nowhere) and sends it with every reserve,
// commit and renew. For a request bound to a namespace, Handler qualifies the holder as
// HOLDER@HASH, HASH being the first proofHashLen hex digits of the secret's SHA-256, before
// the ledger sees it; the ledger's fence then compares (key, holder, token) atomically, so a
// client that read another's holder can neither settle nor renew that attempt: its own
// secret gives another suffix. Requests with every namespace (the store's own user on its
// socket) keep their holders as sent. A Client strips the suffixes from the records it
// returns, so that its callers (the interceptor) see each holder as it was named.
const (
	proofSecretBytes = 16
	proofHashLen     = 32
)

// prover is one client's secret and the holder suffix it proves.
type prover struct {
	secret string
	suffix string // "@" + the first proofHashLen hex digits of SHA-256(secret)
}

func newProver() *prover {
	var b [proofSecretBytes]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	s := hex.EncodeToString(b[:])
	return &prover{secret: s, suffix: proofSuffix(s)}
}

// proofSuffix is the holder suffix that secret proves.
func proofSuffix(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "@" + hex.EncodeToString(sum[:])[:proofHashLen]
}

// validProof reports whether s has the form of a client secret.
func validProof(s string) bool {
	if len(s) != 2*proofSecretBytes {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// own strips the proof suffix of every holder of r, in place: a Client's callers see each
// holder as the client that reserved it named it (the server keeps the qualified holder, and
// fences on it).
func (p *prover) own(r *residual.Residual) {
	if r == nil {
		return
	}
	for i := range r.Attempts {
		r.Attempts[i].Holder = unqualified(r.Attempts[i].Holder)
	}
	for i := range r.Evidence {
		r.Evidence[i].Holder = unqualified(r.Evidence[i].Holder)
	}
}

// ownLease strips the proof suffix of l's holder.
func (p *prover) ownLease(l *lease.Lease) {
	l.Holder = unqualified(l.Holder)
}

// unqualified returns holder without a proof suffix ("@" and proofHashLen hex digits).
func unqualified(holder string) string {
	i := len(holder) - proofHashLen - 1
	if i < 1 || holder[i] != '@' {
		return holder
	}
	for _, c := range holder[i+1:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return holder
		}
	}
	return holder[:i]
}

// The wire forms of the fenced steps: the ledger's parameters and the client's secret.
type (
	reserveRequest struct {
		ledger.ReserveParams
		Proof string `json:",omitempty"`
	}
	commitRequest struct {
		ledger.CommitParams
		Proof string `json:",omitempty"`
	}
	renewRequest struct {
		ledger.RenewParams
		Proof string `json:",omitempty"`
	}
)
