package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Job is a webhook delivery as the webhook API reports it.
type Job struct {
	JobID   string `json:"job_id"`
	EventID string `json:"event_id"`
	Status  string `json:"status"`
}

// webhookAPI is the local fake upstream: it queues each delivery (202 with a Location to
// poll) and delivers it when the test world says so.
type webhookAPI struct {
	mu         sync.Mutex
	jobs       map[string]*Job
	deliveries int
	polls      int
}

func newWebhookAPI() *webhookAPI { return &webhookAPI{jobs: map[string]*Job{}} }

func (a *webhookAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/deliveries":
		body, _ := io.ReadAll(r.Body)
		var in struct {
			EventID string `json:"event_id"`
		}
		if json.Unmarshal(body, &in) != nil || in.EventID == "" {
			http.Error(w, `{"error":"event_id is required"}`, http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.deliveries++
		job := &Job{JobID: fmt.Sprintf("job_%d", a.deliveries), EventID: in.EventID, Status: "queued"}
		a.jobs[job.JobID] = job
		out := *job
		a.mu.Unlock()
		w.Header().Set("Location", "/jobs/"+job.JobID)
		writeJSON(w, http.StatusAccepted, out)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/jobs/"):
		a.mu.Lock()
		a.polls++
		job, ok := a.jobs[strings.TrimPrefix(r.URL.Path, "/jobs/")]
		var out Job
		if ok {
			out = *job
		}
		a.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":"no such job"}`, http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, out)
	default:
		http.Error(w, "no such endpoint", http.StatusNotFound)
	}
}

// deliverAll finishes every queued job, as the API's workers eventually do.
func (a *webhookAPI) deliverAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, j := range a.jobs {
		j.Status = "delivered"
	}
}

func (a *webhookAPI) counts() (deliveries, polls int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.deliveries, a.polls
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
