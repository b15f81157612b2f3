package mcpserver

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
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

const recoveryNotHolder = "only the caller that received the lease_secret from begin_call may commit or renew this attempt; " +
	"do not perform or settle the call: wait for its holder, or for the lease to expire and then reconcile or " +
	"resolve_residual (inspect_residual shows it)"

// authorize finds the attempt of r issued under token and checks that secret is its lease
// secret. It returns the attempt and the holder to fence the ledger step with, or the
// isError result of tool (lease_lost) naming the problem; it writes nothing.
func authorize(tool string, r *residual.Residual, token uint64, secret string) (*residual.Attempt, string, *mcp.CallToolResult) {
	var attempt *residual.Attempt
	for i := range r.Attempts {
		if r.Attempts[i].Token == token {
			attempt = &r.Attempts[i]
		}
	}
	if attempt == nil {
		v := &Violation{
			Kind: string(interceptor.LeasePreempted), State: r.State, Token: r.Token, Recovery: recoveries[interceptor.LeasePreempted],
			Message: fmt.Sprintf("token %d was never issued for key %s (its highest token is %d)", token, r.Key, r.Token),
		}
		return nil, "", errorResult(tool, ErrorInfo{Kind: kindLeaseLost, Message: v.Message, Recovery: v.Recovery, Violation: v})
	}
	i := strings.LastIndexByte(attempt.Holder, '#')
	if i < 0 || len(attempt.Holder)-i-1 != holderHashLen {
		return nil, "", toolError(tool, kindLeaseLost, fmt.Sprintf("token %d of key %s is held by %s, which did not begin the call over MCP "+
			"and has no lease_secret; nothing was written", token, r.Key, attempt.Holder), recoveryNotHolder)
	}
	name, hash := attempt.Holder[:i], attempt.Holder[i+1:]
	if subtle.ConstantTimeCompare([]byte(hash), []byte(secretHash(secret))) != 1 {
		return nil, "", toolError(tool, kindLeaseLost, fmt.Sprintf("lease_secret does not match the holder %s of token %d of key %s; "+
			"nothing was written", attempt.Holder, token, r.Key), recoveryNotHolder)
	}
	return attempt, holderOf(name, secret), nil
}

// checkClaim checks the outcome an agent claims against what it reports from upstream, with
// the operation's classifier (the interceptor's default when none is registered). With an
// upstream status, the classifier judges the status and body alone: the claim must not
// decide the classification it is checked against. Without one, the claim is what there
// is, and only a queued body overrides it. The claim is accepted when it matches, or when
// it is more cautious: unknown always, accepted for what reads as a success. It returns nil,
// or the isError result refusing the claim (the residual is unchanged).
func checkClaim(classify interceptor.Classifier, claimed residual.State, in CommitInput, body []byte) *mcp.CallToolResult {
	if claimed == residual.Unknown {
		return nil
	}
	resp := interceptor.Response{Body: body, Status: in.UpstreamStatus, Handle: in.Handle}
	if in.UpstreamStatus == 0 {
		resp.Outcome = claimed
	}
	got := interceptor.Classify(classify, resp, nil)
	if got == claimed || claimed == residual.Accepted && got == residual.Succeeded {
		return nil
	}
	return refusedClassification(claimed, got, in)
}

func refusedClassification(claimed, got residual.State, in CommitInput) *mcp.CallToolResult {
	if got == residual.Accepted {
		why := "the upstream body says the work is queued / pending"
		if in.UpstreamStatus == 202 {
			why = "upstream answered 202 Accepted"
		}
		return toolError(ToolCommit, kindRefused,
			fmt.Sprintf("outcome %s refused: %s, which is not a confirmed effect; the residual is unchanged", claimed, why),
			"commit it again as outcome=accepted with the handle (status URL or job id) so the key waits for upstream; "+
				"resolve_residual or reconcile settles it once upstream finishes")
	}
	why := fmt.Sprintf("the operation's classifier reads this upstream answer as %s", got)
	if in.UpstreamStatus != 0 {
		why = fmt.Sprintf("upstream_status %d implies %s", in.UpstreamStatus, got)
		switch got {
		case residual.Unknown:
			why += " (a timeout, conflict, rate limit or server error does not prove that upstream did nothing)"
		case residual.Failed:
			why += " (upstream refused the request before any effect)"
		}
	}
	recovery := fmt.Sprintf("commit it as outcome=%s, or as outcome=unknown when you cannot tell", got)
	switch got {
	case residual.Unknown:
		recovery = "commit it as outcome=unknown; the key then blocks until reconcile or resolve_residual settles it after checking upstream"
	case residual.Succeeded:
		recovery = "commit it as outcome=succeeded (or accepted / unknown if you know less)"
	}
	return toolError(ToolCommit, kindRefused, fmt.Sprintf("outcome %s refused: %s; the residual is unchanged", claimed, why), recovery)
}
