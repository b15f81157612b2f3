package evals

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// Kinds of sink log records.
const (
	// kindEffect: the sink performed the side effect (once per record).
	kindEffect = "effect"
	// kindAccepted: the sink answered 202 and queued a job; no effect yet.
	kindAccepted = "accepted"
	// kindJobFailed: a queued job ended without an effect.
	kindJobFailed = "job_failed"
)

// record is one line of the sink's append-only log. The sink writes and fsyncs it before it
// answers the request that caused it, so the log is the ground truth of what was done.
type record struct {
	// Seq numbers records in the order the sink wrote them, from 1.
	Seq int64 `json:"seq"`
	// Kind is kindEffect, kindAccepted or kindJobFailed.
	Kind string `json:"kind"`
	// Intent is the business identity of the request (the invoice, the message id).
	Intent string `json:"intent"`
	// Key is the Idempotency-Key header the client sent, if any.
	Key string `json:"key,omitempty"`
	// Digest is the SHA-256 (hex) of the request's business payload.
	Digest string `json:"digest,omitempty"`
	// ID is the effect id ("e-12") of an effect, the id the sink returned to the client.
	ID string `json:"id,omitempty"`
	// Job is the job id ("j-7") of a queued request, returned to the client with the 202.
	Job string `json:"job,omitempty"`
	// Holder is the X-Holder header (for debugging only; never used in grading).
	Holder string    `json:"holder,omitempty"`
	At     time.Time `json:"at"`
}

// readLog parses a sink log. It returns an error naming the line of a malformed record;
// a torn last line (a sink killed mid-write) is ignored.
func readLog(r io.Reader) ([]record, error) {
	var out []record
	err := scanLog(r, func(rec record) error {
		out = append(out, rec)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// scanLog parses a sink log record by record, calling fn for each in log order, so a log
// of millions of records is never held in memory at once. It returns fn's first error, or
// an error naming the line of a malformed record; a torn last line is ignored.
func scanLog(r io.Reader, fn func(record) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	var pendingErr error
	for sc.Scan() {
		line++
		if pendingErr != nil {
			return pendingErr
		}
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var rec record
		if err := json.Unmarshal(b, &rec); err != nil {
			// Only the last line may be torn.
			pendingErr = fmt.Errorf("evals: sink log line %d: %w", line, err)
			continue
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("evals: reading sink log: %w", err)
	}
	return nil
}

// readLogFile reads the sink log at path (see readLog).
func readLogFile(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("evals: %w", err)
	}
	defer f.Close()
	return readLog(f)
}

// scanLogFile scans the sink log at path (see scanLog).
func scanLogFile(path string, fn func(record) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("evals: %w", err)
	}
	defer f.Close()
	return scanLog(f, fn)
}
