package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/toolfence/toolfence/httpguard"
)

// Charge is one charge the fake payment API made.
type Charge struct {
	ID             string `json:"id"`
	Invoice        string `json:"invoice"`
	AmountCents    int64  `json:"amount_cents"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key"`
	Status         string `json:"status"`
}

// PaymentAPI is a fake payment API on 127.0.0.1. Like a naive real one it does not
// deduplicate: every accepted POST /charges is a new charge, so a repeated call shows up in
// Count. It records the Idempotency-Key of each charge so a probe can look it up.
//
// Endpoints:
//   - POST /charges with a JSON body {"invoice","amount_cents","currency"} and an
//     Idempotency-Key header: records a charge and answers 201 with it (400 without the
//     header or with a bad body: no charge is made);
//   - GET /charges?idempotency_key=K: 200 with the charge made under K, or 404;
//   - GET /charges: {"count": N, "charges": [...]}.
//
// It is safe for concurrent use.
type PaymentAPI struct {
	// URL is the base URL, "http://127.0.0.1:PORT".
	URL string

	srv     *http.Server
	arrived chan Charge
	quit    chan struct{}
	held    sync.WaitGroup

	mu       sync.Mutex
	charges  []Charge
	holdNext int
	closed   bool
}

// StartAPI starts a PaymentAPI on a free port of 127.0.0.1. It returns an error when no
// port can be bound. Close stops it.
func StartAPI() (*PaymentAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo: payment API: %w", err)
	}
	a := &PaymentAPI{
		URL:     "http://" + ln.Addr().String(),
		arrived: make(chan Charge, 64),
		quit:    make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", a.charge)
	mux.HandleFunc("GET /charges", a.lookup)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

// HoldNext makes the API record the next n charges but withhold its answer to them until
// the client goes away or the API is closed: the charge happened, the caller never hears.
func (a *PaymentAPI) HoldNext(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.holdNext = n
}

// Arrivals delivers every charge as soon as it is recorded (before any answer is sent). It
// buffers 64 charges; later ones are not announced when nobody reads.
func (a *PaymentAPI) Arrivals() <-chan Charge { return a.arrived }

// Count returns how many charges the API has made.
func (a *PaymentAPI) Count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.charges)
}

// Lookup returns the charge made under the idempotency key, and whether there is one.
func (a *PaymentAPI) Lookup(key string) (Charge, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.charges {
		if c.IdempotencyKey == key {
			return c, true
		}
	}
	return Charge{}, false
}

// Close stops the server, aborts withheld answers and waits for their handlers to end.
func (a *PaymentAPI) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	close(a.quit)
	a.mu.Unlock()
	err := a.srv.Close()
	a.held.Wait()
	return err
}

func (a *PaymentAPI) charge(w http.ResponseWriter, r *http.Request) {
	key, keyErr := httpguard.RequestKey(r) // quoted as tools.Transport sends it, or bare
	var in struct {
		Invoice     string `json:"invoice"`
		AmountCents int64  `json:"amount_cents"`
		Currency    string `json:"currency"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	switch {
	case err != nil:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "reading body: " + err.Error()})
		return
	case keyErr != nil:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": keyErr.Error()})
		return
	case json.Unmarshal(body, &in) != nil || in.Invoice == "" || in.AmountCents <= 0 || in.Currency == "":
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"invoice","amount_cents" > 0,"currency"}`})
		return
	}

	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "shutting down"})
		return
	}
	c := Charge{
		ID: fmt.Sprintf("ch_%d", len(a.charges)+1), Invoice: in.Invoice, AmountCents: in.AmountCents,
		Currency: in.Currency, IdempotencyKey: key, Status: "succeeded",
	}
	a.charges = append(a.charges, c)
	hold := a.holdNext > 0
	if hold {
		a.holdNext--
		a.held.Add(1)
	}
	a.mu.Unlock()

	select {
	case a.arrived <- c:
	default:
	}
	if hold {
		defer a.held.Done()
		select {
		case <-r.Context().Done():
		case <-a.quit:
		}
		// Drop the connection without an answer.
		panic(http.ErrAbortHandler)
	}
	writeJSON(w, http.StatusCreated, c)
}

func (a *PaymentAPI) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	if key == "" {
		a.mu.Lock()
		list := append([]Charge{}, a.charges...)
		a.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"count": len(list), "charges": list})
		return
	}
	c, ok := a.Lookup(key)
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no charge with this idempotency key"})
		return
	}
	writeJSON(w, http.StatusOK, c)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"encoding"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
