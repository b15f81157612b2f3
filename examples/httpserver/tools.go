package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/toolfence/toolfence/interceptor"
)

// tools is the in-memory state behind the tool endpoints: what an agent's calls did. Every
// effect is counted, so a duplicate would show in /stats.
type tools struct {
	mu      sync.Mutex
	tickets []ticket
	emails  []email
	deploys []deploy
}

type ticket struct {
	ID    int    `json:"id"`
	Title string `json:"title"`
	Body  string `json:"body,omitempty"`
	By    string `json:"opened_by"`
	// Token is the fencing token of the request that opened it.
	Token uint64 `json:"token"`
}

type email struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

type deploy struct {
	ID      int       `json:"id"`
	Service string    `json:"service"`
	Version string    `json:"version"`
	Started time.Time `json:"started_at"`
}

// deployTime is how long a deploy runs before its status says "done".
const deployTime = 2 * time.Second

func newTools() *tools { return &tools{} }

func (t *tools) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tools/create_ticket", t.createTicket)
	mux.HandleFunc("POST /tools/send_email", t.sendEmail)
	mux.HandleFunc("POST /tools/deploy", t.deploy)
	mux.HandleFunc("GET /tickets/{id}", t.getTicket)
	mux.HandleFunc("GET /deploys/{id}", t.getDeploy)
	mux.HandleFunc("GET /stats", t.stats)
	return mux
}

func (t *tools) createTicket(w http.ResponseWriter, r *http.Request) {
	var in struct{ Title, Body string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Title == "" {
		http.Error(w, "want a JSON body with a title", http.StatusBadRequest) // 4xx: no effect, retryable
		return
	}
	d, _ := interceptor.DispatchFrom(r.Context())
	t.mu.Lock()
	tk := ticket{ID: len(t.tickets) + 1, Title: in.Title, Body: in.Body, By: d.Task, Token: d.Token}
	t.tickets = append(t.tickets, tk)
	t.mu.Unlock()
	w.Header().Set("Location", fmt.Sprintf("/tickets/%d", tk.ID))
	writeJSON(w, http.StatusCreated, tk)
}

func (t *tools) sendEmail(w http.ResponseWriter, r *http.Request) {
	var in email
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.To == "" {
		http.Error(w, "want a JSON body with to and subject", http.StatusBadRequest)
		return
	}
	t.mu.Lock()
	t.emails = append(t.emails, in)
	n := len(t.emails)
	t.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"sent": true, "message": n})
}

func (t *tools) deploy(w http.ResponseWriter, r *http.Request) {
	var in struct{ Service, Version string }
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Service == "" {
		http.Error(w, "want a JSON body with service and version", http.StatusBadRequest)
		return
	}
	t.mu.Lock()
	dp := deploy{ID: len(t.deploys) + 1, Service: in.Service, Version: in.Version, Started: time.Now()}
	t.deploys = append(t.deploys, dp)
	t.mu.Unlock()
	// Accepted, not done: the guard stores it as accepted and replays this 202.
	w.Header().Set("Location", fmt.Sprintf("/deploys/%d", dp.ID))
	writeJSON(w, http.StatusAccepted, map[string]any{"deploy": dp.ID, "state": "running"})
}

func (t *tools) getTicket(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, err := strconv.Atoi(r.PathValue("id"))
	if err != nil || i < 1 || i > len(t.tickets) {
		http.NotFound(w, r)
		return
	}
	writeJSON(w, http.StatusOK, t.tickets[i-1])
}

func (t *tools) getDeploy(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	i, err := strconv.Atoi(r.PathValue("id"))
	if err != nil || i < 1 || i > len(t.deploys) {
		http.NotFound(w, r)
		return
	}
	dp := t.deploys[i-1]
	state := "running"
	if time.Since(dp.Started) >= deployTime {
		state = "done"
	}
	writeJSON(w, http.StatusOK, map[string]any{"deploy": dp, "state": state})
}

func (t *tools) stats(w http.ResponseWriter, r *http.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]int{"tickets": len(t.tickets), "emails": len(t.emails), "deploys": len(t.deploys)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
