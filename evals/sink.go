package evals

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/toolfence/toolfence/residual"
)

// Sink modes, chosen per request with the "mode" query parameter. A fault mode applies only
// to the first request of an intent; later requests of the same intent are answered 200, so
// a retry can succeed and a duplicate shows up as a second effect.
const (
	modeOK         = "ok"          // effect, then 200
	modeQueued     = "queued"      // 202 with a job; the job completes later with the effect
	modeQueuedFail = "queued_fail" // 202 with a job; the job later fails with no effect
	modeFail       = "fail"        // effect, then 500
	modeHang       = "hang"        // effect, then no answer until the client gives up
	modeDrop       = "drop"        // effect, then the connection is closed without an answer
)

// sinkOptions configures a sink.
type sinkOptions struct {
	// LogPath is the append-only log file. Required.
	LogPath string
	// HonorIdempotency makes the sink answer a repeated Idempotency-Key with the stored
	// answer and no new effect. Defaults to off: the evals must not rely on upstream dedupe.
	HonorIdempotency bool
	// CompleteAfter is how long a queued job takes. Defaults to 100ms.
	CompleteAfter time.Duration
}

// sink is the effect sink: an HTTP API that performs the "side effect" by appending a record
// to its own fsync'd log before answering. Concurrent requests share fsyncs (group commit):
// a request is answered only after an fsync that started after its record was written.
// It is safe for concurrent use.
type sink struct {
	cfg sinkOptions
	f   *os.File

	// written is the Seq of the last record written to the file (not necessarily synced).
	written atomic.Int64
	gc      groupCommit

	mu      sync.Mutex
	seq     int64
	nEffect int64
	nJob    int64
	seen    map[string]int           // requests per intent
	byKey   map[string][]lookupRec   // effects and accepted records by Idempotency-Key
	answers map[string]storedAnswer  // first answer per Idempotency-Key (when honouring)
	jobs    map[string]*job          // by job id
	held    map[string]*heldResponse // by intent
	changed chan struct{}            // closed and replaced whenever held changes
	honor   bool
	// draining is set by Drain: effect requests are refused from then on.
	draining bool
	// work counts effect requests in flight and queued jobs not yet recorded; Add happens
	// under mu while draining is false, or from work already counted, so never after Wait.
	work sync.WaitGroup
}

// lookupRec is what the sink keeps in memory of a record, for /lookup.
type lookupRec struct {
	seq              int64
	kind, intent, id string
	job              string
}

// groupCommit lets one fsync cover every record written before it started.
type groupCommit struct {
	mu      sync.Mutex
	cond    *sync.Cond
	synced  int64 // every record with Seq <= synced is durable
	syncing bool
	syncs   int64
}

type storedAnswer struct {
	status int
	body   []byte
}

type job struct {
	intent, key, digest, id, status, effect string
}

type heldResponse struct {
	seq    int64
	action chan string
}

// newSink opens (creating or appending to) the log and returns a sink. It returns an error
// when the log cannot be opened.
func newSink(cfg sinkOptions) (*sink, error) {
	if cfg.LogPath == "" {
		return nil, errors.New("evals: sink: log path is required")
	}
	if cfg.CompleteAfter <= 0 {
		cfg.CompleteAfter = 100 * time.Millisecond
	}
	f, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("evals: sink: %w", err)
	}
	s := &sink{
		cfg: cfg, f: f, seen: map[string]int{}, byKey: map[string][]lookupRec{},
		answers: map[string]storedAnswer{}, jobs: map[string]*job{}, held: map[string]*heldResponse{},
		changed: make(chan struct{}), honor: cfg.HonorIdempotency,
	}
	s.gc.cond = sync.NewCond(&s.gc.mu)
	return s, nil
}

// Close closes the log. Call Drain first unless the sink is being abandoned: a queued
// job that completes after Close cannot record its effect.
func (s *sink) Close() error { return s.f.Close() }

// Drain refuses new effect requests (503) and returns once every effect request in flight
// has answered and every queued job has written and synced its final record: after Drain
// the log holds everything the sink will ever do. Stop the HTTP server (so held and
// hanging requests end) before calling it. It may be called more than once.
func (s *sink) Drain() {
	s.mu.Lock()
	s.draining = true
	s.mu.Unlock()
	s.work.Wait()
}

// enter counts an effect request as in flight; false when the sink is draining.
func (s *sink) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.work.Add(1)
	return true
}

// writeLocked numbers rec and writes it to the log, without syncing; s.mu must be held (so
// records reach the file in Seq order). Call syncTo(rec.Seq) before acting on it.
func (s *sink) writeLocked(rec *record) error {
	s.seq++
	rec.Seq = s.seq
	rec.At = time.Now().UTC()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := s.f.Write(append(b, '\n')); err != nil {
		return err
	}
	s.written.Store(rec.Seq)
	return nil
}

// syncTo returns once record seq is durable: after an fsync that started when it was
// already written. One fsync covers every record written before it started; callers that
// arrive while one runs wait for it and, if it does not cover them, share the next one.
// It must be called without s.mu.
func (s *sink) syncTo(seq int64) error {
	g := &s.gc
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.synced < seq {
		if g.syncing {
			g.cond.Wait()
			continue
		}
		g.syncing = true
		target := s.written.Load()
		g.mu.Unlock()
		err := s.f.Sync()
		g.mu.Lock()
		g.syncing = false
		g.cond.Broadcast()
		if err != nil {
			return err
		}
		g.syncs++
		g.synced = max(g.synced, target)
	}
	return nil
}

// Syncs returns how many fsyncs the sink's log took so far (group commit makes it fewer
// than the records under concurrency).
func (s *sink) Syncs() int64 {
	s.gc.mu.Lock()
	defer s.gc.mu.Unlock()
	return s.gc.syncs
}

// Handler returns the sink's HTTP API:
//
//	POST /effect?mode=M&hold=1    perform the effect (body: JSON with "intent")
//	GET  /status/{job}             a queued job's status
//	GET  /lookup?key=K|intent=I    effects and jobs, for probes
//	GET  /control/held?intent=I    long-poll until a held response exists for I
//	GET  /control/held?prefix=P&n=N   … until N are held for intents starting with P
//	POST /control/release?intent=I|prefix=P&action=respond|drop
//	POST /control/idempotency?on=1|0
func (s *sink) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /effect", s.effect)
	mux.HandleFunc("GET /status/{job}", s.status)
	mux.HandleFunc("GET /lookup", s.lookup)
	mux.HandleFunc("GET /control/held", s.waitHeld)
	mux.HandleFunc("POST /control/release", s.release)
	mux.HandleFunc("POST /control/idempotency", func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.honor = r.URL.Query().Get("on") == "1"
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// effectBody is the part of the request body the sink reads.
type effectBody struct {
	Intent string `json:"intent"`
}

func (s *sink) effect(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		http.Error(w, "sink is draining", http.StatusServiceUnavailable)
		return
	}
	defer s.work.Done()
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var eb effectBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Intent == "" {
		http.Error(w, "body must be JSON with an intent", http.StatusBadRequest)
		return
	}
	digest, err := residual.Digest(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	q := r.URL.Query()

	s.mu.Lock()
	if s.honor && key != "" {
		if a, ok := s.answers[key]; ok {
			s.mu.Unlock()
			writeJSON(w, a.status, a.body)
			return
		}
	}
	s.seen[eb.Intent]++
	first := s.seen[eb.Intent] == 1
	mode := modeOK
	if first && q.Get("mode") != "" {
		mode = q.Get("mode")
	}
	rec := &record{Intent: eb.Intent, Key: key, Digest: digest, Holder: r.Header.Get("X-Holder")}
	var status int
	var answer []byte
	switch mode {
	case modeQueued, modeQueuedFail:
		s.nJob++
		rec.Kind, rec.Job = kindAccepted, fmt.Sprintf("j-%d", s.nJob)
		status = http.StatusAccepted
		answer, _ = json.Marshal(map[string]string{"status": "queued", "job": rec.Job})
	case modeOK, modeFail, modeHang, modeDrop:
		s.nEffect++
		rec.Kind, rec.ID = kindEffect, fmt.Sprintf("e-%d", s.nEffect)
		status = http.StatusOK
		answer, _ = json.Marshal(map[string]string{"status": "done", "effect_id": rec.ID})
	default:
		s.mu.Unlock()
		http.Error(w, "unknown mode "+mode, http.StatusBadRequest)
		return
	}
	if err := s.writeLocked(rec); err != nil {
		s.mu.Unlock()
		http.Error(w, "sink log: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.mu.Unlock()
	if err := s.syncTo(rec.Seq); err != nil {
		http.Error(w, "sink log: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	// Durable: publish it to lookups, queue its job, hold its answer.
	s.mu.Lock()
	// A request without a key is published under "": found by its intent only.
	s.byKey[key] = append(s.byKey[key], lookupRec{seq: rec.Seq, kind: rec.Kind, intent: rec.Intent, id: rec.ID, job: rec.Job})
	if key != "" {
		if _, ok := s.answers[key]; !ok && mode != modeFail {
			s.answers[key] = storedAnswer{status, answer}
		}
	}
	if rec.Kind == kindAccepted {
		j := &job{intent: eb.Intent, key: key, digest: digest, id: rec.Job, status: "queued"}
		s.jobs[j.id] = j
		s.work.Add(1) // this request is counted: the counter is not zero
		go s.complete(j, mode == modeQueuedFail)
	}
	var h *heldResponse
	if first && q.Get("hold") == "1" {
		h = &heldResponse{seq: rec.Seq, action: make(chan string, 1)}
		s.held[eb.Intent] = h
		close(s.changed)
		s.changed = make(chan struct{})
	}
	s.mu.Unlock()

	if h != nil {
		// The effect is durable; the answer waits for the parent (which may kill the client).
		var action string
		select {
		case action = <-h.action:
		case <-r.Context().Done():
			action = "gone"
		}
		s.mu.Lock()
		if s.held[eb.Intent] == h {
			delete(s.held, eb.Intent)
		}
		s.mu.Unlock()
		if action == "drop" || action == "gone" {
			mode = modeDrop
		}
	}
	switch mode {
	case modeFail:
		http.Error(w, `{"status":"error","error":"internal error after the effect"}`, http.StatusInternalServerError)
	case modeHang:
		select {
		case <-r.Context().Done():
		case <-time.After(30 * time.Second):
		}
	case modeDrop:
		dropConn(w)
	default:
		writeJSON(w, status, answer)
	}
}

// dropConn closes the connection without an answer: the response is lost in transit.
func dropConn(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			_ = c.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

// complete finishes a queued job after CompleteAfter (the upstream's own processing time)
// and records its outcome.
func (s *sink) complete(j *job, fail bool) {
	defer s.work.Done()
	time.Sleep(s.cfg.CompleteAfter)
	s.mu.Lock()
	rec := &record{Intent: j.intent, Key: j.key, Digest: j.digest, Job: j.id}
	if fail {
		rec.Kind = kindJobFailed
	} else {
		s.nEffect++
		rec.Kind, rec.ID = kindEffect, fmt.Sprintf("e-%d", s.nEffect)
	}
	err := s.writeLocked(rec)
	s.mu.Unlock()
	if err == nil {
		err = s.syncTo(rec.Seq)
	}
	if err != nil {
		return // the job stays queued; probes keep seeing it open
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if fail {
		j.status = "failed"
	} else {
		j.status, j.effect = "done", rec.ID
		if j.key != "" {
			s.byKey[j.key] = append(s.byKey[j.key], lookupRec{seq: rec.Seq, kind: rec.Kind, intent: rec.Intent, id: rec.ID, job: rec.Job})
		}
	}
}

func (s *sink) status(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	j, ok := s.jobs[r.PathValue("job")]
	var b []byte
	if ok {
		b, _ = json.Marshal(map[string]string{"status": j.status, "job": j.id, "effect_id": j.effect})
	}
	s.mu.Unlock()
	if !ok {
		http.Error(w, "no such job", http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// lookupAnswer is what GET /lookup returns.
type lookupAnswer struct {
	Effects []lookupEffect `json:"effects"`
	Jobs    []lookupJob    `json:"jobs"`
}

// lookupEffect is one effect in a lookupAnswer.
type lookupEffect struct {
	ID  string `json:"id"`
	Job string `json:"job,omitempty"`
}

// lookupJob is one queued job in a lookupAnswer.
type lookupJob struct {
	Job    string `json:"job"`
	Status string `json:"status"`
	Effect string `json:"effect_id,omitempty"`
}

func (s *sink) lookup(w http.ResponseWriter, r *http.Request) {
	key, intent := r.URL.Query().Get("key"), r.URL.Query().Get("intent")
	ans := lookupAnswer{Effects: []lookupEffect{}, Jobs: []lookupJob{}}
	s.mu.Lock()
	var recs []lookupRec
	if key != "" {
		recs = slices.Clone(s.byKey[key])
	} else {
		for _, rs := range s.byKey {
			for _, rec := range rs {
				if rec.intent == intent {
					recs = append(recs, rec)
				}
			}
		}
	}
	// Records are published after their fsync, not always in Seq order.
	slices.SortFunc(recs, func(a, b lookupRec) int { return int(a.seq - b.seq) })
	for _, rec := range recs {
		switch rec.kind {
		case kindEffect:
			ans.Effects = append(ans.Effects, lookupEffect{ID: rec.id, Job: rec.job})
		case kindAccepted:
			j := s.jobs[rec.job]
			ans.Jobs = append(ans.Jobs, lookupJob{Job: j.id, Status: j.status, Effect: j.effect})
		}
	}
	s.mu.Unlock()
	b, _ := json.Marshal(ans)
	writeJSON(w, http.StatusOK, b)
}

// heldLocked counts the held answers of intent, or (prefix set) of every intent starting
// with prefix; s.mu must be held.
func (s *sink) heldLocked(intent, prefix string) int {
	if prefix == "" {
		if s.held[intent] != nil {
			return 1
		}
		return 0
	}
	n := 0
	for in := range s.held {
		if strings.HasPrefix(in, prefix) {
			n++
		}
	}
	return n
}

// waitHeld long-polls until the answer of intent is held, or (prefix set) until n answers
// of intents starting with prefix are; it answers {"held": count, "intents": [...]} (the
// intents with prefix only), with 408 when the timeout passed first.
func (s *sink) waitHeld(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	intent, prefix := q.Get("intent"), q.Get("prefix")
	want := 1
	if prefix != "" {
		if n, err := strconv.Atoi(q.Get("n")); err == nil && n >= 0 {
			want = n
		}
	}
	timeout, err := time.ParseDuration(q.Get("timeout"))
	if err != nil || timeout <= 0 {
		timeout = 10 * time.Second
	}
	answer := func(status, n int) {
		ans := struct {
			Held    int      `json:"held"`
			Intents []string `json:"intents,omitempty"`
		}{Held: n}
		if prefix != "" {
			s.mu.Lock()
			for in := range s.held {
				if strings.HasPrefix(in, prefix) {
					ans.Intents = append(ans.Intents, in)
				}
			}
			s.mu.Unlock()
		}
		b, _ := json.Marshal(ans)
		writeJSON(w, status, b)
	}
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		n, ch := s.heldLocked(intent, prefix), s.changed
		s.mu.Unlock()
		if n >= want {
			answer(http.StatusOK, n)
			return
		}
		select {
		case <-ch:
		case <-deadline:
			answer(http.StatusRequestTimeout, n)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// release lets the held answer of intent (or of every intent starting with prefix) go
// ("respond") or drops its connection ("drop"); 404 when nothing matched.
func (s *sink) release(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	intent, prefix, action := q.Get("intent"), q.Get("prefix"), q.Get("action")
	if action != "drop" {
		action = "respond"
	}
	var hs []*heldResponse
	s.mu.Lock()
	for in, h := range s.held {
		if prefix != "" && strings.HasPrefix(in, prefix) || prefix == "" && in == intent {
			hs = append(hs, h)
		}
	}
	s.mu.Unlock()
	if len(hs) == 0 {
		http.Error(w, "nothing held", http.StatusNotFound)
		return
	}
	for _, h := range hs {
		select {
		case h.action <- action:
		default:
		}
	}
	writeJSON(w, http.StatusOK, []byte(`{"released":`+strconv.Itoa(len(hs))+`}`))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// SinkMain runs a sink process: it listens on --addr, prints its base URL on stdout and
// serves until SIGTERM/SIGINT, or until stdin closes with --exit-on-stdin-eof (so a sink
// never outlives the parent that started it). Then it stops the server and drains (see
// sink.Drain) before it exits: once the process has exited, its log is complete, which is
// what Run waits for before grading. It returns the process exit code.
func SinkMain(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("eval-sink", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	logPath := fs.String("log", "", "append-only effect log (required)")
	honor := fs.Bool("honor-idempotency", false, "answer a repeated Idempotency-Key without a new effect")
	completeAfter := fs.Duration("complete-after", 100*time.Millisecond, "how long a queued job takes")
	stdinEOF := fs.Bool("exit-on-stdin-eof", false, "exit when stdin closes (set by a parent process)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	s, err := newSink(sinkOptions{LogPath: *logPath, HonorIdempotency: *honor, CompleteAfter: *completeAfter})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "evals: sink:", err)
		return 1
	}
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(stdout, "http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *stdinEOF {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop()
		}()
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	code := 0
	select {
	case <-ctx.Done():
	case err := <-served:
		fmt.Fprintln(os.Stderr, "evals: sink:", err)
		code = 1
	}
	// Held and hanging answers end when Close drops their connections; the grace period
	// lets finished answers reach their clients first.
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	_ = srv.Close()
	s.Drain()
	return code
}
