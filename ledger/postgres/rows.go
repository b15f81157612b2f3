package postgres

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolfence/toolfence/residual"
)

// columns of toolfence_residuals in the order scanRow reads them.
var columns = []string{
	"namespace", "key", "task", "operation", "target", "state", "request_digest", "token",
	"att_n", "att_holder", "att_token", "att_lease_expires", "att_started", "att_ended",
	"att_request_digest", "att_response_digest", "att_outcome", "att_error", "att_released",
	"att_reservation", "prior_attempts", "result", "result_digest", "result_truncated",
	"handle", "evidence", "resolutions", "created_at", "updated_at",
}

// cols returns the column list, each prefixed with alias and a dot when alias is set.
func cols(alias string) string {
	if alias == "" {
		return strings.Join(columns, ", ")
	}
	return alias + "." + strings.Join(columns, ", "+alias+".")
}

// now is the SQL for the ledger's clock: the server's clock_timestamp() plus the test-only
// offset passed as parameter $n (microseconds).
func now(n int) string {
	return fmt.Sprintf("(clock_timestamp() + $%d::bigint * interval '1 microsecond')", n)
}

// statementNow is the ledger's clock at the start of the statement: the server's
// statement_timestamp() plus the test-only offset ($n, microseconds). Every use in one
// statement gives the same instant.
func statementNow(n int) string {
	return fmt.Sprintf("(statement_timestamp() + $%d::bigint * interval '1 microsecond')", n)
}

// collected is the state of a tombstone: the row GC leaves of a residual it collected,
// keeping only the key and its last token so that the key's tokens keep growing. Ledger
// reads never return tombstones.
const collected = "collected"

// collected reports whether the row is a tombstone.
func (r *row) collected() bool { return r.state == collected }

// row is one stored residual as its columns.
type row struct {
	namespace, key, task, operation, target, state, requestDigest string
	token                                                         int64
	attN                                                          int32
	attHolder                                                     string
	attToken                                                      int64
	attExpires, attStarted                                        time.Time
	attEnded                                                      *time.Time
	attRequestDigest, attResponseDigest, attOutcome, attError     string
	attReleased                                                   bool
	attReservation                                                string
	prior, evidence, resolutions                                  []byte
	result                                                        []byte
	resultDigest                                                  string
	resultTruncated                                               bool
	handle                                                        string
	createdAt, updatedAt                                          time.Time

	// dst backs the scan destinations (the columns and up to 11 extra), so that scanning a
	// row allocates no slice.
	dst [40]any
}

// dest returns scan destinations for the columns, followed by extra.
func (r *row) dest(extra ...any) []any {
	return append(append(r.dst[:0],
		&r.namespace, &r.key, &r.task, &r.operation, &r.target, &r.state, &r.requestDigest, &r.token,
		&r.attN, &r.attHolder, &r.attToken, &r.attExpires, &r.attStarted, &r.attEnded,
		&r.attRequestDigest, &r.attResponseDigest, &r.attOutcome, &r.attError, &r.attReleased,
		&r.attReservation, &r.prior, &r.result, &r.resultDigest, &r.resultTruncated,
		&r.handle, &r.evidence, &r.resolutions, &r.createdAt, &r.updatedAt), extra...)
}

// scanRow scans one row of columns (plus extra destinations) into a residual.
func scanRow(s pgx.Row, extra ...any) (*residual.Residual, *row, error) {
	var r row
	if err := s.Scan(r.dest(extra...)...); err != nil {
		return nil, nil, err
	}
	res, err := r.residual()
	return res, &r, err
}

// residual decodes the row. Times come back in UTC; empty lists and results as nil.
func (r *row) residual() (*residual.Residual, error) {
	res := &residual.Residual{
		Key: r.key, Namespace: r.namespace, Task: r.task, Operation: r.operation, Target: r.target,
		State: residual.State(r.state), RequestDigest: r.requestDigest, Token: uint64(r.token),
		ResultDigest: r.resultDigest, ResultTruncated: r.resultTruncated, Handle: r.handle,
		CreatedAt: r.createdAt.UTC(), UpdatedAt: r.updatedAt.UTC(),
	}
	if len(r.result) > 0 {
		res.Result = r.result
	}
	if err := unmarshalList(r.prior, &res.Attempts); err != nil {
		return nil, fmt.Errorf("postgres: decode attempts of %s: %w", r.key, err)
	}
	if r.attN > 0 {
		a := residual.Attempt{
			N: int(r.attN), Holder: r.attHolder, Token: uint64(r.attToken),
			LeaseExpires: r.attExpires.UTC(), Started: r.attStarted.UTC(),
			RequestDigest: r.attRequestDigest, ResponseDigest: r.attResponseDigest,
			Outcome: residual.State(r.attOutcome), Error: r.attError, Released: r.attReleased,
		}
		if r.attEnded != nil {
			a.Ended = r.attEnded.UTC()
		}
		res.Attempts = append(res.Attempts, a)
		res.AttemptCount = a.N
	}
	if err := unmarshalList(r.evidence, &res.Evidence); err != nil {
		return nil, fmt.Errorf("postgres: decode evidence of %s: %w", r.key, err)
	}
	if err := unmarshalList(r.resolutions, &res.Resolutions); err != nil {
		return nil, fmt.Errorf("postgres: decode resolutions of %s: %w", r.key, err)
	}
	for i := range res.Attempts {
		a := &res.Attempts[i]
		a.LeaseExpires, a.Started, a.Ended = utc(a.LeaseExpires), utc(a.Started), utc(a.Ended)
	}
	for i := range res.Evidence {
		res.Evidence[i].At = utc(res.Evidence[i].At)
	}
	for i := range res.Resolutions {
		res.Resolutions[i].At = utc(res.Resolutions[i].At)
	}
	return res, nil
}

func unmarshalList[T any](b []byte, into *[]T) error {
	if len(b) == 0 || string(b) == "[]" {
		return nil
	}
	var v []T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if len(v) > 0 {
		*into = append(*into, v...)
	}
	return nil
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// writeSQL stores every column of a residual read under FOR UPDATE ($1 namespace, $2 key)
// and notifies watchers (see notifyModes).
var writeSQL = notifyModes(func(watched string) string {
	return `UPDATE toolfence_residuals SET
	task = $3, operation = $4, target = $5, state = $6, request_digest = $7, token = $8,
	att_n = $9, att_holder = $10, att_token = $11, att_lease_expires = $12, att_started = $13,
	att_ended = $14, att_request_digest = $15, att_response_digest = $16, att_outcome = $17,
	att_error = $18, att_released = $19,
	att_reservation = CASE WHEN $20::text = '' THEN att_reservation ELSE $20::text END, prior_attempts = $21,
	result = $22, result_digest = $23, result_truncated = $24, handle = $25, evidence = $26,
	resolutions = $27, created_at = $28, updated_at = $29
WHERE namespace = $1 AND key = $2
RETURNING ` + watched
})

// writeArgs returns the arguments of writeSQL for res; reservation identifies the Reserve
// call of the current attempt (kept when empty). It refuses a residual whose state is not
// one of the five (an error wrapping residual.ErrInvalidState): the table has no CHECK on
// the state (see migration 0002), so this is where a bad state stops.
func writeArgs(res *residual.Residual, reservation string) ([]any, error) {
	if !res.State.Valid() {
		return nil, fmt.Errorf("postgres: refusing to write key %s in state %q: %w", res.Key, res.State, residual.ErrInvalidState)
	}
	var cur residual.Attempt
	var prior []residual.Attempt
	if n := len(res.Attempts); n > 0 {
		cur, prior = res.Attempts[n-1], res.Attempts[:n-1]
	}
	var ended *time.Time
	if !cur.Ended.IsZero() {
		e := cur.Ended.UTC()
		ended = &e
	}
	if cur.LeaseExpires.IsZero() {
		cur.LeaseExpires = res.UpdatedAt
	}
	if cur.Started.IsZero() {
		cur.Started = res.CreatedAt
	}
	pj, err := marshalList(prior)
	if err != nil {
		return nil, err
	}
	ej, err := marshalList(res.Evidence)
	if err != nil {
		return nil, err
	}
	rj, err := marshalList(res.Resolutions)
	if err != nil {
		return nil, err
	}
	var result []byte
	if len(res.Result) > 0 {
		result = res.Result
	}
	return []any{
		res.Namespace, res.Key, res.Task, res.Operation, res.Target, string(res.State), res.RequestDigest, int64(res.Token),
		int32(cur.N), cur.Holder, int64(cur.Token), cur.LeaseExpires.UTC(), cur.Started.UTC(),
		ended, cur.RequestDigest, cur.ResponseDigest, string(cur.Outcome),
		cur.Error, cur.Released, reservation, pj,
		result, res.ResultDigest, res.ResultTruncated, res.Handle, ej,
		rj, res.CreatedAt.UTC(), res.UpdatedAt.UTC(),
	}, nil
}

// marshalList encodes a list as a JSON array (never null), with times in UTC.
func marshalList[T any](v []T) (string, error) {
	if len(v) == 0 {
		return "[]", nil
	}
	norm := make([]T, len(v))
	copy(norm, v)
	for i := range norm {
		switch x := any(&norm[i]).(type) {
		case *residual.Attempt:
			x.LeaseExpires, x.Started, x.Ended = utc(x.LeaseExpires), utc(x.Started), utc(x.Ended)
		case *residual.Evidence:
			x.At = utc(x.At)
		case *residual.Resolution:
			x.At = utc(x.At)
		}
	}
	b, err := json.Marshal(norm)
	if err != nil {
		return "", fmt.Errorf("postgres: encode: %w", err)
	}
	return string(b), nil
}
