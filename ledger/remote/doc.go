// Package remote reaches a ledger over HTTP/JSON: Client is a ledger.Ledger (and a
// ledger.Watcher and ledger.OpenCounter) that talks to Handler, which serves any
// ledger.Ledger; Shared lets several processes use one embedded store that only one of them
// can open (the owner serves the others on a unix socket inside the store's directory).
//
// It imports ledger, residual, lease and internal/httpserve only; it is a transport, with no
// ordering logic of its own (every rule stays in the backend behind Handler).
//
// # Protocol
//
// Every step is one POST to PREFIX/METHOD (PREFIX is Path, "/ledger/v1/"; METHOD is one of
// reserve, commit, renew, resolve, evidence, get, list, gc, open, watch) with
// "Content-Type: application/json", whose body is the JSON of the method's ledger parameters (field names as in Go; durations in nanoseconds)
// and whose answer is {"result": …, "error": {"message": …, "codes": […]}}. A 200 answer is
// the backend's own answer: result, error or both (a Commit refused for a lost fence
// returns the stored residual and the error). The error's codes name every sentinel of
// package ledger and residual the backend's error wraps, so errors.Is works on the client
// exactly as on the backend (the ledger contract has no typed errors with fields: the
// interceptor's *Violation is built on the caller's side from these sentinels and the
// returned residual). Any other status means the step did not run: 400 (malformed
// or unknown JSON fields), 401 (no or unknown bearer token), 403 (a namespace the request
// may not use, or an Origin header that is not loopback: a web page), 404, 405, 413 (body
// over HandlerOptions.MaxBody), 415 (not application/json), 503 (the server's ledger is
// closed). watch answers a stream of JSON lines, one ledger.Change each.
//
// # Lost answers
//
// A mutating step (reserve, commit, renew, resolve, evidence, gc) whose request was sent
// but whose answer never came (the connection broke, the server died, the request timed
// out), or whose answer is not this server's (a 5xx without an error code of this
// protocol, as from a gateway in between; a 200 with neither a result nor an error) returns
// an error wrapping ledger.ErrOutcomeUnknown and ErrConnectionLost: it may have happened. A
// read in those cases returns ErrConnectionLost (a 200 without a result: ErrProtocol). A request that never left (the server could not be dialled) returns an
// error wrapping ledger.ErrUnavailable: it did not happen and may be repeated.
//
// # Access
//
// Handler asks its Authorizer for each request's Access: every namespace (the owner's unix
// socket, which only the store's user can open: mode 0600) or one namespace (a bearer
// token of `toolfence serve --http`). A request bound to one namespace that names another,
// or every namespace (GC or Watch without a namespace, OpenResiduals), gets 403 and an
// error wrapping ledger.ErrForbidden.
package remote
