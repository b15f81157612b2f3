// Command email is the re-worded-retry story: the agent sends a welcome email; the
// conversation is replayed after the chat front end lost the answer, and the model words the
// email differently. The key comes from the intent (task, operation, recipient and kind of
// email), not from the bytes, so the second send is refused as a payload mismatch and the
// first result is shown instead.
//
// It runs offline: a scripted model, a fake email API on 127.0.0.1 and the embedded badger
// ledger in a temporary directory. It exits non-zero if the email API's counts are wrong.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/internal/scripted"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/tools"
)

const (
	task  = "onboarding-bob"
	input = "Welcome our new customer Bob (bob@example.com) by email."
)

// emailAPI is the local fake upstream: it sends every message it is given.
type emailAPI struct {
	mu   sync.Mutex
	sent []string
}

func (a *emailAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/messages" {
		http.Error(w, "no such endpoint", http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.sent = append(a.sent, string(body))
	id := fmt.Sprintf("msg_%d", len(a.sent))
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%q,"status":"sent"}`, id)
}

func (a *emailAPI) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sent)
}

// sendEmail is an ordinary langchaingo tool, written without toolfence in mind except for
// its HTTP client, whose transport forwards the key and classifies the answer.
type sendEmail struct {
	api    string
	client *http.Client
}

func (s sendEmail) Name() string { return "send_email" }

func (s sendEmail) Description() string {
	return `Send an email. Input: {"to": address, "kind": "welcome"|"invoice"|..., "subject": text, "body": text}`
}

func (s sendEmail) Call(ctx context.Context, input string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.api+"/messages", strings.NewReader(input))
	if err != nil {
		return "", err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return "", fmt.Errorf("email API answered %s: %s", resp.Status, raw)
	}
	return string(raw), nil
}

func email(subject, body string) string {
	raw, _ := json.Marshal(map[string]string{"to": "bob@example.com", "kind": "welcome", "subject": subject, "body": body})
	return string(raw)
}

func main() {
	if err := story(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
}

func story() error {
	dir, err := os.MkdirTemp("", "toolfence-email-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	api := &emailAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()

	led, err := badger.Open(dir, badger.Options{})
	if err != nil {
		return err
	}
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Config{Holder: "onboarding-agent"})
	if err != nil {
		return err
	}
	// One line: the key is (task, send_email, recipient and kind), whatever the wording.
	guarded := tools.Guard(sendEmail{api: srv.URL, client: &http.Client{Transport: &tools.Transport{}, Timeout: 30 * time.Second}},
		ic, tools.WithTarget("/to", "/kind"), tools.WithUpstreamName("the email API"))
	ctx := interceptor.WithTask(context.Background(), task)

	fmt.Println("== run 1: the agent sends the welcome email")
	model := &scripted.Model{Steps: []scripted.Step{
		{Tool: "send_email", Args: email("Welcome, Bob!", "Hi Bob, welcome aboard. Reply to this email if you need anything.")},
		{Expect: `{"id":"msg_1"`, Final: "Sent Bob a welcome email."},
	}}
	if _, err := scripted.Run(ctx, model, []lctools.Tool{guarded}, input); err != nil {
		return fmt.Errorf("run 1: %w", err)
	}

	fmt.Println("== the chat front end lost the answer; the conversation is replayed and the model re-words the email")
	model = &scripted.Model{Steps: []scripted.Step{
		{Tool: "send_email", Args: email("Bob, great to have you with us", "Hello Bob! We are thrilled you joined. Write back any time.")},
		{Expect: `refused: send_email on ["bob@example.com","welcome"] was already done on `,
			Think: "The welcome email already went out; the first result stands.",
			Final: "Bob already got his welcome email (msg_1); I did not send another."},
	}}
	answer, err := scripted.Run(ctx, model, []lctools.Tool{guarded}, input)
	if err != nil {
		return fmt.Errorf("run 2: %w", err)
	}
	fmt.Println("run 2 finished:", answer)
	if obs := model.Answers(); len(obs) != 1 || !strings.Contains(obs[0], `the first result stands: {"id":"msg_1","status":"sent"}`) {
		return fmt.Errorf("the refusal did not show the first result: %q", obs)
	}

	sent := api.count()
	fmt.Printf("upstream counts: sent=%d\n", sent)
	if sent != 1 {
		return fmt.Errorf("want sent=1")
	}
	fmt.Println("OK: one welcome email, however the model worded it")
	return nil
}
