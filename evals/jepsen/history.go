package jepsen

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// Kind names a ledger step of the workload.
type Kind string

// The steps the workload runs and the model knows.
const (
	KReserve  Kind = "reserve"
	KCommit   Kind = "commit"
	KRenew    Kind = "renew"
	KResolve  Kind = "resolve"
	KEvidence Kind = "evidence"
	KGet      Kind = "get"
	KGC       Kind = "gc"
)

// Result classifies how a step ended.
type Result string

// Step results. Business refusals are definite outcomes; Fail means the ledger says the step
// did not happen; Indeterminate means nobody can tell (timeout, reset, ErrOutcomeUnknown, a
// killed client): the checker lets it have happened or not, at any time after its call.
const (
	ROK                Result = "ok"
	RLeaseLost         Result = "lease_lost"
	RNotFound          Result = "not_found"
	RInProgress        Result = "in_progress"
	RInvalidTransition Result = "invalid_transition"
	RFail              Result = "fail"
	RIndeterminate     Result = "indeterminate"
)

// Input is what a client asked of the ledger.
type Input struct {
	Kind       Kind           `json:"kind"`
	Key        string         `json:"key"` // the workload's slot name, e.g. "e3k1"
	Holder     string         `json:"holder,omitempty"`
	Digest     string         `json:"digest,omitempty"`
	TTL        time.Duration  `json:"ttl,omitempty"`
	Redispatch bool           `json:"redispatch,omitempty"`
	Token      uint64         `json:"token,omitempty"`
	Outcome    residual.State `json:"outcome,omitempty"`
	Margin     time.Duration  `json:"margin,omitempty"`
	As         residual.State `json:"as,omitempty"`
	By         string         `json:"by,omitempty"`
	Note       string         `json:"note,omitempty"`
}

// Output is what the client learnt. Times are the ledger's clock in ns since the epoch.
type Output struct {
	Result   Result         `json:"result"`
	Err      string         `json:"err,omitempty"`
	Decision string         `json:"decision,omitempty"`
	State    residual.State `json:"state,omitempty"` // effective state of the returned residual
	Token    uint64         `json:"token,omitempty"`
	Holder   string         `json:"holder,omitempty"` // holder of the current attempt
	Attempts int            `json:"attempts,omitempty"`
	Evidence int            `json:"evidence,omitempty"`
	Resolved int            `json:"resolutions,omitempty"`
	HasRes   bool           `json:"has_residual,omitempty"` // the fields above describe a residual
	Started  int64          `json:"started,omitempty"`      // current attempt's start (Acquired)
	Expires  int64          `json:"expires,omitempty"`      // lease expiry (Acquired, Renew)
	Ended    int64          `json:"ended,omitempty"`        // end of the committed token's attempt (Commit; 0 when it is no longer stored, which judges nothing)
	// Issued is the token a Resolve issued: the returned residual's token when its latest
	// resolution carries it, 0 when the key moved on before the answer (a retry answers the
	// residual as re-read), which judges nothing.
	Issued uint64 `json:"issued,omitempty"`
}

// Op is one step of the history: invoked at Call and answered at Return (wall clock, ns).
// Offset is the ledger clock's offset from the wall clock at call and return (ns): zero
// for PostgreSQL, whose server clock on this host decides; the injected skew for badger.
type Op struct {
	ID      int64   `json:"id"`
	Proc    int     `json:"proc"`   // worker process (incarnation) number
	Client  int     `json:"client"` // client number, unique in the run
	In      Input   `json:"in"`
	Out     *Output `json:"out,omitempty"` // nil until answered; stays nil when the client died
	Call    int64   `json:"call"`
	Return  int64   `json:"return,omitempty"`
	OffCall int64   `json:"off_call,omitempty"`
	OffRet  int64   `json:"off_ret,omitempty"`
}

// event is one line of a worker's output: a call or a return of an op.
type event struct {
	T   string  `json:"t"` // "call", "ret", "info"
	Op  *Op     `json:"op,omitempty"`
	Msg string  `json:"msg,omitempty"`
	ID  int64   `json:"id,omitempty"`
	Out *Output `json:"out,omitempty"`
	Ret int64   `json:"ret,omitempty"`
	Off int64   `json:"off,omitempty"`
}

// recorder writes events as JSON lines, one write per line so that a killed process leaves
// whole lines only (a pipe write under PIPE_BUF bytes is atomic).
type recorder struct {
	mu sync.Mutex
	w  io.Writer
}

func (r *recorder) emit(e event) {
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("jepsen: marshal event: %v", err)) // our own types: cannot fail
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.w.Write(b)
}

// History collects the ops of a run from every worker.
type History struct {
	mu  sync.Mutex
	ops map[int64]*Op
	log []string
}

func newHistory() *History { return &History{ops: map[int64]*Op{}} }

// add applies one event line.
func (h *History) add(e event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch e.T {
	case "call":
		h.ops[e.Op.ID] = e.Op
	case "ret":
		if op := h.ops[e.ID]; op != nil {
			op.Out, op.Return, op.OffRet = e.Out, e.Ret, e.Off
		}
	case "info":
		h.log = append(h.log, e.Msg)
	}
}

// read consumes a worker's event stream until it ends; a torn last line is ignored.
func (h *History) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.T != "call" || e.Op != nil) {
			h.add(e)
		}
	}
}

// Ops returns the ops ordered by call time. Ops that never returned are indeterminate.
func (h *History) Ops() []*Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Op, 0, len(h.ops))
	for _, op := range h.ops {
		c := *op
		if c.Out == nil {
			c.Out = &Output{Result: RIndeterminate, Err: "no answer: the client was killed or the run ended"}
		}
		out = append(out, &c)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Call < out[j].Call || out[i].Call == out[j].Call && out[i].ID < out[j].ID
	})
	return out
}

// WriteHistory writes ops as JSON lines to path.
func WriteHistory(path string, ops []*Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, op := range ops {
		if err := enc.Encode(op); err != nil {
			f.Close()
			return err
		}
	}
	return errors.Join(w.Flush(), f.Close())
}

// ReadHistory reads a history written by WriteHistory.
func ReadHistory(path string) ([]*Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ops []*Op
	dec := json.NewDecoder(f)
	for dec.More() {
		var op Op
		if err := dec.Decode(&op); err != nil {
			return nil, fmt.Errorf("jepsen: read history %s: %w", path, err)
		}
		ops = append(ops, &op)
	}
	return ops, nil
}
