package jepsen

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/ledger/postgres"
)

// WorkerEnv names the environment variable that carries a worker's configuration (JSON) to
// a re-executed binary. A binary that finds it set runs WorkerMain instead of its usual main.
const WorkerEnv = "TOOLFENCE_JEPSEN_WORKER"

// workerConfig is what the harness tells one worker process.
type workerConfig struct {
	Backend      string        `json:"backend"` // "badger" or "postgres"
	Store        string        `json:"store"`   // badger directory or PostgreSQL DSN (through the proxy)
	Schema       string        `json:"schema,omitempty"`
	Proc         int           `json:"proc"`
	Clients      int           `json:"clients"`
	ClientBase   int           `json:"client_base"`
	Workload     Workload      `json:"workload"`
	Offset       time.Duration `json:"offset"`
	Seed         uint64        `json:"seed"`
	WriteTimeout time.Duration `json:"write_timeout,omitempty"`
	// AllowAsync opens PostgreSQL with AllowAsyncReplicas (Options.AsyncStandby).
	AllowAsync bool `json:"allow_async,omitempty"`
}

// IsWorker reports whether this process was started as a harness worker.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// WorkerMain runs a worker process: it opens the ledger named by the configuration in
// WorkerEnv, runs its clients and writes their steps as JSON lines to stdout, until stdin
// says "stop" or closes. Lines "skew <ns>" on stdin set the clock offset. It returns the
// process exit code.
func WorkerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(WorkerEnv)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "jepsen worker: bad %s: %v\n", WorkerEnv, err)
		return 2
	}
	clock := &SkewClock{}
	clock.Set(cfg.Offset)
	l, err := openLedger(context.Background(), cfg, clock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "jepsen worker %d: open: %v\n", cfg.Proc, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "skew":
				if d, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					clock.Set(time.Duration(d))
				}
			case len(f) == 1 && f[0] == "stop":
				cancel()
				return
			}
		}
		cancel() // the harness went away
	}()
	rec := &recorder{w: os.Stdout}
	ledgerOffset := func() time.Duration { return 0 }
	if cfg.Backend == "badger" {
		ledgerOffset = clock.Offset
	}
	runClients(ctx, l, cfg, clock, ledgerOffset, rec)
	_ = l.Close()
	return 0
}

// runClients runs cfg.Clients clients on l until ctx ends.
func runClients(ctx context.Context, l ledger.Ledger, cfg workerConfig, clock *SkewClock, ledgerOffset func() time.Duration, rec *recorder) {
	var seq atomic.Int64
	seq.Store(int64(cfg.Proc) << 32)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		c := &client{id: cfg.ClientBase + i, proc: cfg.Proc, l: l, rec: rec, w: cfg.Workload,
			rng: rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.ClientBase+i))), clock: clock, ledgerOffset: ledgerOffset, seq: &seq}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.run(ctx)
		}()
	}
	wg.Wait()
}

func openLedger(ctx context.Context, cfg workerConfig, clock *SkewClock) (ledger.Ledger, error) {
	switch cfg.Backend {
	case "badger":
		return badger.Open(cfg.Store, badger.Options{Clock: clock})
	case "postgres":
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var l *postgres.Ledger
		var err error
		for {
			l, err = postgres.Open(octx, cfg.Store, postgres.Options{Schema: cfg.Schema, Clock: clock,
				MaxConns: int32(cfg.Clients + 1), ConnectTimeout: 2 * time.Second, WriteTimeout: cfg.WriteTimeout,
				AllowAsyncReplicas: cfg.AllowAsync})
			if err == nil || octx.Err() != nil {
				return l, err
			}
			time.Sleep(200 * time.Millisecond) // the nemesis may be holding the network
		}
	}
	return nil, fmt.Errorf("jepsen: unknown backend %q (want badger or postgres)", cfg.Backend)
}

// RunInProcess runs the given number of clients as goroutines against l for d in this
// process and returns their history (the checker's tests use it with planted bugs). Keys
// rotate per w; seed fixes the clients' choices.
func RunInProcess(ctx context.Context, l ledger.Ledger, clients int, w Workload, d time.Duration, seed uint64) []*Op {
	h := newHistory()
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		h.read(pr)
		close(done)
	}()
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	runClients(ctx, l, workerConfig{Clients: clients, Workload: w, Seed: seed}, &SkewClock{},
		func() time.Duration { return 0 }, &recorder{w: pw})
	_ = pw.Close()
	<-done
	return h.Ops()
}

func jsonIndent(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }
