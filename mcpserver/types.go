package mcpserver

import (
	"encoding/json"
	"math"
	"reflect"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/mcpwire"
	"github.com/toolfence/toolfence/residual"
)

// The tool inputs. Field docs become the descriptions of the reflected input schemas, so
// they are written for the agent that reads them.

// ListPendingInput is the input of list_pending.
type ListPendingInput struct {
	Task      string `json:"task,omitempty" jsonschema_description:"Only residuals of this task (agent run / job / conversation id)."`
	Operation string `json:"operation,omitempty" jsonschema_description:"Only residuals of this operation (tool name)."`
	Target    string `json:"target,omitempty" jsonschema_description:"Only residuals of this target (the thing mutated, e.g. invoice:INV-42)."`
	State     string `json:"state,omitempty" jsonschema:"enum=pending,enum=unknown,enum=accepted" jsonschema_description:"Only residuals in this state; default: all three open states."`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=1000" jsonschema_description:"Page size; default 100."`
	Cursor    string `json:"cursor,omitempty" jsonschema_description:"next_cursor of the previous page."`
}

// InspectInput is the input of inspect_residual.
type InspectInput struct {
	Key string `json:"key" jsonschema_description:"The residual key (tf1_ followed by 64 hex digits)."`
}

// BeginInput is the input of begin_call.
type BeginInput struct {
	Task      string          `json:"task" jsonschema_description:"The unit of work that must not repeat an effect (agent run / job / conversation id); a successor uses the same task."`
	Operation string          `json:"operation" jsonschema_description:"The tool about to be called (optionally versioned)."`
	Target    string          `json:"target" jsonschema_description:"The thing the call mutates (e.g. invoice:INV-42 or email:bob@example.com); with task and operation it makes the key."`
	Args      json.RawMessage `json:"args" jsonschema:"type=object" jsonschema_description:"The arguments of the call; a retry with other arguments is refused as a payload mismatch once the key succeeded."`
	Holder    string          `json:"holder,omitempty" jsonschema_description:"Who is calling (named in leases and audits); default derived from the MCP client."`
	LeaseMS   Millis          `json:"lease_ms,omitempty" jsonschema:"minimum=1" jsonschema_description:"Lease length in milliseconds; the call must finish (or renew_lease) before it ends. Default 30000."`
}

// CommitInput is the input of commit_call.
type CommitInput struct {
	Key            string          `json:"key" jsonschema_description:"The key begin_call returned."`
	Token          uint64          `json:"token" jsonschema:"minimum=1" jsonschema_description:"The fencing token begin_call returned."`
	LeaseSecret    string          `json:"lease_secret" jsonschema:"pattern=^[0-9a-f]{32}$" jsonschema_description:"The lease_secret begin_call returned with proceed: it proves you are the holder of the token."`
	Outcome        string          `json:"outcome" jsonschema:"enum=succeeded,enum=accepted,enum=failed,enum=unknown" jsonschema_description:"succeeded: upstream confirmed the effect (2xx); accepted: upstream queued it (202 / queued) - give the handle; failed: upstream confirmed no effect (400, 401, 403, 404, 422); unknown: you cannot tell (timeout, 408, 409, 429, 5xx, crash). Must agree with upstream_status: a claim the status contradicts is refused unless it is more cautious (unknown always is)."`
	Result         json.RawMessage `json:"result,omitempty" jsonschema_description:"The result to cache and replay to later calls with the same key."`
	Handle         string          `json:"handle,omitempty" jsonschema_description:"Upstream handle (status URL, job id) of an accepted call."`
	UpstreamStatus int             `json:"upstream_status,omitempty" jsonschema:"minimum=0,maximum=999" jsonschema_description:"Upstream HTTP status, if any."`
	UpstreamBody   json.RawMessage `json:"upstream_body,omitempty" jsonschema_description:"What upstream answered (object or text), checked for queued answers."`
	Error          string          `json:"error,omitempty" jsonschema_description:"Error text of the call, if it failed."`
}

// RenewInput is the input of renew_lease.
type RenewInput struct {
	Key         string `json:"key" jsonschema_description:"The key begin_call returned."`
	Token       uint64 `json:"token" jsonschema:"minimum=1" jsonschema_description:"The fencing token begin_call returned."`
	LeaseSecret string `json:"lease_secret" jsonschema:"pattern=^[0-9a-f]{32}$" jsonschema_description:"The lease_secret begin_call returned with proceed: it proves you are the holder of the token."`
	LeaseMS     Millis `json:"lease_ms" jsonschema:"minimum=1" jsonschema_description:"New lease length in milliseconds from now."`
}

// ResolveInput is the input of resolve_residual.
type ResolveInput struct {
	Key      string          `json:"key" jsonschema_description:"The key of an unknown or accepted residual."`
	As       string          `json:"as" jsonschema:"enum=succeeded,enum=failed" jsonschema_description:"succeeded: the effect happened upstream (later calls replay); failed: it did not (later calls start a new attempt)."`
	Note     string          `json:"note" jsonschema_description:"Why: what you checked upstream and what you found."`
	Result   json.RawMessage `json:"result,omitempty" jsonschema_description:"Result to cache when resolving as succeeded."`
	Evidence string          `json:"evidence,omitempty" jsonschema_description:"What upstream answered, for the audit."`
	By       string          `json:"by,omitempty" jsonschema_description:"Who resolves (agent or person); default derived from the MCP client."`
}

// ReconcileInput is the input of reconcile.
type ReconcileInput struct {
	Key       string `json:"key,omitempty" jsonschema_description:"Probe only this residual."`
	Task      string `json:"task,omitempty" jsonschema_description:"Probe the open residuals of this task."`
	Operation string `json:"operation,omitempty" jsonschema_description:"Probe the open residuals of this operation."`
	Cursor    string `json:"cursor,omitempty" jsonschema_description:"next_cursor of the previous answer: probe the next page."`
}

// The tool outputs; Client returns them too.

// ResidualSummary is one row of list_pending.
type ResidualSummary struct {
	Key       string         `json:"key"`
	Task      string         `json:"task"`
	Operation string         `json:"operation"`
	Target    string         `json:"target"`
	State     residual.State `json:"state"`
	Attempt   int            `json:"attempt"`
	Holder    string         `json:"holder,omitempty"`
	Token     uint64         `json:"token"`
	// LeaseExpiresAt is the expiry of the current attempt's lease.
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	// Since is when the current attempt started.
	Since    time.Time `json:"since,omitzero"`
	Handle   string    `json:"handle,omitempty"`
	Recovery string    `json:"recovery"`
}

// ListResult is the output of list_pending.
type ListResult struct {
	Residuals  []ResidualSummary `json:"residuals"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// PendingPage is one page of the toolfence://pending resource: when more remain, Next is
// the URI of the next page (toolfence://pending?cursor=…).
type PendingPage struct {
	ListResult
	Next string `json:"next,omitempty"`
}

// ResidualView is the whole residual as inspect_residual shows it: results are JSON values
// (non-JSON bytes appear as a JSON string).
type ResidualView struct {
	Key             string                `json:"key"`
	Namespace       string                `json:"namespace"`
	Task            string                `json:"task"`
	Operation       string                `json:"operation"`
	Target          string                `json:"target"`
	State           residual.State        `json:"state"`
	RequestDigest   string                `json:"request_digest"`
	Attempts        []residual.Attempt    `json:"attempts"`
	AttemptCount    int                   `json:"attempt_count"`
	Result          json.RawMessage       `json:"result,omitempty"`
	ResultDigest    string                `json:"result_digest,omitempty"`
	ResultTruncated bool                  `json:"result_truncated,omitempty"`
	Handle          string                `json:"handle,omitempty"`
	Evidence        []EvidenceView        `json:"evidence,omitempty"`
	Resolutions     []residual.Resolution `json:"resolutions,omitempty"`
	Token           uint64                `json:"token"`
	CreatedAt       time.Time             `json:"created_at"`
	UpdatedAt       time.Time             `json:"updated_at"`
	Recovery        string                `json:"recovery"`
}

// EvidenceView is residual.Evidence with the result as a JSON value.
type EvidenceView struct {
	At             time.Time       `json:"at"`
	Holder         string          `json:"holder"`
	Token          uint64          `json:"token"`
	Outcome        residual.State  `json:"outcome,omitempty"`
	ResponseDigest string          `json:"response_digest,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	Handle         string          `json:"handle,omitempty"`
	Note           string          `json:"note,omitempty"`
	WriteID        string          `json:"write_id,omitempty"`
}

// Decisions of begin_call.
const (
	// DecisionProceed: the lease is yours; perform the call, then commit_call.
	DecisionProceed = "proceed"
	// DecisionReplay: the key already succeeded; use Result and do not perform the call.
	DecisionReplay = "replay"
	// DecisionBlocked: do not perform the call; Violation says why and what to do.
	DecisionBlocked = "blocked"
)

// BeginResult is the output of begin_call.
type BeginResult struct {
	Decision string `json:"decision" jsonschema:"enum=proceed,enum=replay,enum=blocked"`
	Key      string `json:"key"`
	// Attempt and Token: the new attempt (proceed) or the recorded one (replay, blocked).
	Attempt int    `json:"attempt,omitempty"`
	Token   uint64 `json:"token,omitempty"`
	// Holder is the holder recorded on the attempt: the holder name, "#" and the first 16
	// hex digits of the SHA-256 of the attempt's lease secret (for attempts begun over MCP).
	Holder string `json:"holder,omitempty"`
	// LeaseSecret (proceed only) is 128 random bits in hex, handed out once and stored
	// nowhere: commit_call and renew_lease require it, so a client that only knows the
	// (small, visible) token cannot settle or extend another holder's attempt.
	LeaseSecret string `json:"lease_secret,omitempty"`
	// LeaseExpiresAt and LeaseMS describe the lease of a proceed decision.
	LeaseExpiresAt time.Time `json:"lease_expires_at,omitzero"`
	LeaseMS        int64     `json:"lease_ms,omitempty"`
	// Result is the cached result of a replay.
	Result          json.RawMessage    `json:"result,omitempty"`
	ResultTruncated bool               `json:"result_truncated,omitempty"`
	Violation       *mcpwire.Violation `json:"violation,omitempty"`
}

// CommitResult is the output of commit_call.
type CommitResult struct {
	Key             string         `json:"key"`
	State           residual.State `json:"state"`
	Attempt         int            `json:"attempt"`
	Token           uint64         `json:"token"`
	Handle          string         `json:"handle,omitempty"`
	ResultDigest    string         `json:"result_digest,omitempty"`
	ResultTruncated bool           `json:"result_truncated,omitempty"`
	RecordedAt      time.Time      `json:"recorded_at"`
}

// RenewResult is the output of renew_lease.
type RenewResult struct {
	Key            string    `json:"key"`
	Token          uint64    `json:"token"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
}

// ResolveResult is the output of resolve_residual.
type ResolveResult struct {
	Key  string         `json:"key"`
	From residual.State `json:"from"`
	// State is the settled state; Token the new fencing token that fences out older holders.
	State residual.State `json:"state"`
	Token uint64         `json:"token"`
}

// ReconcileResult is the output of reconcile: the interceptor's report of one page of
// residuals (Options.PageSize), and the cursor of the next page when more remain.
type ReconcileResult struct {
	interceptor.ReconcileReport
	NextCursor string `json:"next_cursor,omitempty"`
}

// Millis is a duration in whole milliseconds. It accepts any JSON number with an integral
// value (1000, 1000.0, 1e3), since clients that compute it in floating point send those.
type Millis int64

// UnmarshalJSON accepts an integral JSON number that fits in an int64; anything else is a
// *json.UnmarshalTypeError naming the field lease_ms (its only use).
func (m *Millis) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil || f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		kind := "number " + string(b)
		switch {
		case len(b) > 0 && b[0] == '"':
			kind = "string"
		case string(b) == "true" || string(b) == "false":
			kind = "bool"
		case len(b) > 0 && (b[0] == '{' || b[0] == '['):
			kind = "object or array"
		}
		return &json.UnmarshalTypeError{Value: kind, Type: reflect.TypeFor[int64]()}
	}
	*m = Millis(f)
	return nil
}
