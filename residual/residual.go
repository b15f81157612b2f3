package residual

import "time"

// Residual is the durable record of one intended operation: (namespace, task, operation,
// target) and every attempt made at it. Ledgers store it; its JSON form is what `toolfence
// show --json` and the MCP server print.
type Residual struct {
	Key       string `json:"key"`
	Namespace string `json:"namespace"`
	Task      string `json:"task"`
	Operation string `json:"operation"`
	Target    string `json:"target"`
	// State is the effective state: ledgers report a pending residual whose lease has
	// expired as Unknown.
	State State `json:"state"`
	// RequestDigest is the canonical digest of the arguments of the latest attempt.
	RequestDigest string `json:"request_digest"`
	// Attempts in order; the last one is the current one. Ledgers keep the first attempt
	// and the latest ones (a bounded number) and drop those in between, so a key that keeps
	// failing cannot grow its record without limit; AttemptCount counts them all.
	Attempts []Attempt `json:"attempts"`
	// AttemptCount is how many attempts were ever made at the key: the N of the current
	// attempt. It can exceed len(Attempts).
	AttemptCount int `json:"attempt_count"`
	// Result is the cached result of the succeeded attempt (possibly redacted or truncated).
	Result []byte `json:"result,omitempty"`
	// ResultDigest is the SHA-256 of the full result as upstream returned it, before
	// redaction or truncation.
	ResultDigest string `json:"result_digest,omitempty"`
	// ResultTruncated says Result was cut at the configured cap.
	ResultTruncated bool `json:"result_truncated,omitempty"`
	// Handle is the upstream handle (status URL, job id) of an accepted call.
	Handle string `json:"handle,omitempty"`
	// Evidence holds what fenced-out holders observed after they lost their lease.
	Evidence []Evidence `json:"evidence,omitempty"`
	// Resolutions is the audit of reconciliations.
	Resolutions []Resolution `json:"resolutions,omitempty"`
	// Token is the highest fencing token issued for this key.
	Token     uint64    `json:"token"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Attempt is one reservation of the key and what became of it.
type Attempt struct {
	N      int    `json:"n"`
	Holder string `json:"holder"`
	Token  uint64 `json:"token"`
	// LeaseExpires is the wall-clock expiry of the attempt's lease (after renewals).
	LeaseExpires   time.Time `json:"lease_expires_at"`
	Started        time.Time `json:"started_at"`
	Ended          time.Time `json:"ended_at,omitzero"`
	RequestDigest  string    `json:"request_digest"`
	ResponseDigest string    `json:"response_digest,omitempty"`
	// Outcome is the classified outcome once committed; empty while pending.
	Outcome State `json:"outcome,omitempty"`
	// Error is the error text the tool returned, if any.
	Error string `json:"error,omitempty"`
	// Released says the attempt's lease was released by its commit or by a resolution.
	Released bool `json:"released,omitempty"`
}

// Evidence is an outcome observed by a holder that had lost its fence when it tried to
// commit. It is never authoritative; reconcilers read it.
type Evidence struct {
	At             time.Time `json:"at"`
	Holder         string    `json:"holder"`
	Token          uint64    `json:"token"`
	Outcome        State     `json:"outcome,omitempty"`
	ResponseDigest string    `json:"response_digest,omitempty"`
	Result         []byte    `json:"result,omitempty"`
	Handle         string    `json:"handle,omitempty"`
	Note           string    `json:"note,omitempty"`
	// WriteID identifies the ledger call that stored the entry (set by ledgers that retry
	// writes, so a retry recognises its own entry); empty otherwise. Callers leave it empty.
	WriteID string `json:"write_id,omitempty"`
}

// Resolution records who settled an open residual, how and why.
type Resolution struct {
	At       time.Time `json:"at"`
	By       string    `json:"by"`
	Token    uint64    `json:"token"`
	From     State     `json:"from"`
	To       State     `json:"to"`
	Note     string    `json:"note,omitempty"`
	Evidence string    `json:"evidence,omitempty"`
	// WriteID identifies the ledger call that stored the resolution (see Evidence.WriteID).
	WriteID string `json:"write_id,omitempty"`
}

// Current returns the latest attempt, or nil when there is none.
func (r *Residual) Current() *Attempt {
	if r == nil || len(r.Attempts) == 0 {
		return nil
	}
	return &r.Attempts[len(r.Attempts)-1]
}

// LeaseLive reports whether the residual is pending under a lease that has not expired at now.
func (r *Residual) LeaseLive(now time.Time) bool {
	a := r.Current()
	return a != nil && a.Outcome == None && !a.Released && now.Before(a.LeaseExpires)
}

// EffectiveState returns the state a reader must act on at now: a pending residual whose
// lease has expired is Unknown, since its call may have reached upstream.
func (r *Residual) EffectiveState(now time.Time) State {
	if r == nil {
		return None
	}
	if r.State == Pending && !r.LeaseLive(now) {
		return Unknown
	}
	return r.State
}

// Clone returns a deep copy, so callers may modify it without touching a ledger's copy.
func (r *Residual) Clone() *Residual {
	if r == nil {
		return nil
	}
	c := *r
	c.Attempts = append([]Attempt(nil), r.Attempts...)
	c.Result = append([]byte(nil), r.Result...)
	c.Evidence = append([]Evidence(nil), r.Evidence...)
	for i := range c.Evidence {
		c.Evidence[i].Result = append([]byte(nil), c.Evidence[i].Result...)
	}
	c.Resolutions = append([]Resolution(nil), r.Resolutions...)
	return &c
}
