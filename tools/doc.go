// Package tools guards langchaingo tools with toolfence: Guard wraps any tools.Tool, New builds
// typed tools with reflected JSON schemas, and Transport forwards the key to HTTP APIs.
//
// It imports interceptor, ledger, residual, jsonptr, langchaingo, invopop/jsonschema (reflection) and
// santhosh-tekuri/jsonschema (validation); nothing in toolfence imports it.
//
// # What the agent sees
//
// langchaingo's executor aborts a run when a tool returns an error, so by default a guarded
// tool answers every refusal with a plain-language observation the model can act on, and
// returns a Go error only with WithErrors:
//
//	executed            the tool's own output, unchanged
//	replayed            [replayed] already done, outcome recorded at <RFC3339 time>: <cached output>
//	in progress         blocked: another attempt … is still running …; do not retry now …
//	unknown outcome     blocked: a previous attempt may have reached <upstream>; outcome unknown;
//	                    do not retry — reconcile with toolfence (key tf1_…)
//	awaiting upstream   accepted: <upstream> accepted the request and is still working on it …
//	payload mismatch    refused: … was already done with different arguments …; the first
//	                    result stands: <first output>
//	failed (no effect)  failed: <upstream> refused the request and did nothing …
//	not sent            failed: <tool> did not send its request … retrying will not help
//	                    (its HTTP request was built without the ctx the tool was given)
//
// <upstream> is "the upstream of <tool>" unless WithUpstreamName names it.
//
// # HTTP classification
//
// Transport forwards the key as Idempotency-Key and the fencing token as
// Toolfence-Fencing-Token, and classifies each answer (Transport.Overrides changes single
// statuses):
//
//	2xx except 202                              succeeded
//	202                                         accepted; handle = Location, else the body's
//	                                            status_url, job_id or id
//	400, 401, 403, 404, 422                     failed: the request was refused, no effect
//	408, 409, 425, 429, 5xx, other statuses,    unknown: the request may have had an effect;
//	timeouts and transport errors               reconcile before retrying
//
// A guarded tool whose HTTP calls go through Transport is classified by what Transport saw
// of its requests with side effects (GET, HEAD, OPTIONS and TRACE do not count); FromHTTP
// does the same for code that calls interceptor.Interceptor.Do directly. A tool must build its
// requests from the ctx it was given: a request with side effects whose context carries no
// dispatch is not sent (interceptor.ErrNoDispatch), and the attempt is recorded failed, not unknown.
package tools
