package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/toolfence/toolfence/httpguard"
)

// Charge is what the payment API stores and returns, and what the charge tool returns.
type Charge struct {
	ID          string `json:"id"`
	InvoiceID   string `json:"invoice_id"`
	AmountCents int    `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
}

// paymentAPI is the local fake upstream. Like many real APIs it charges every POST it
// receives (it does not deduplicate), but it remembers the Idempotency-Key of each charge so
// a reconciler can look a charge up by it.
type paymentAPI struct {
	mu      sync.Mutex
	charges []Charge
	byKey   map[string]Charge
	posts   int
	lookups int
	// hold makes the next charge hang after it is recorded: charged receives the charge and
	// the handler answers nothing until its client is gone.
	hold    bool
	charged chan Charge
}

func newPaymentAPI() *paymentAPI {
	return &paymentAPI{byKey: map[string]Charge{}, charged: make(chan Charge, 1)}
}

func (a *paymentAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/charges":
		a.charge(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/charges":
		a.lookup(w, r)
	default:
		http.Error(w, "no such endpoint", http.StatusNotFound)
	}
}

func (a *paymentAPI) charge(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var in struct {
		InvoiceID   string `json:"invoice_id"`
		AmountCents int    `json:"amount_cents"`
		Currency    string `json:"currency"`
	}
	if err != nil || json.Unmarshal(body, &in) != nil || in.InvoiceID == "" || in.AmountCents <= 0 {
		http.Error(w, `{"error":"invalid charge"}`, http.StatusUnprocessableEntity)
		return
	}
	a.mu.Lock()
	a.posts++
	c := Charge{
		ID: fmt.Sprintf("ch_%d", len(a.charges)+1), InvoiceID: in.InvoiceID,
		AmountCents: in.AmountCents, Currency: in.Currency, Status: "succeeded",
	}
	a.charges = append(a.charges, c)
	// The key arrives as the draft's structured-field string ("tf1_…"); RequestKey reads it
	// (and a bare key) as the key itself, the form the probe looks up.
	if key, err := httpguard.RequestKey(r); err == nil {
		a.byKey[key] = c
	}
	hold := a.hold
	a.hold = false
	a.mu.Unlock()

	if hold {
		// The card is charged; the answer never leaves. The parent kills the agent now.
		a.charged <- c
		select {
		case <-r.Context().Done():
		case <-time.After(time.Minute):
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

func (a *paymentAPI) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("idempotency_key")
	a.mu.Lock()
	a.lookups++
	c, ok := a.byKey[key]
	a.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":"no charge with that idempotency key"}`, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c)
}

// counts returns the charges made, the POSTs received and the lookups served.
func (a *paymentAPI) counts() (charges, posts, lookups int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.charges), a.posts, a.lookups
}
