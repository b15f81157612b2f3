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
	"bytes"
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

	"github.com/toolfence/toolfence/examples/scripted"
	"github.com/toolfence/toolfence/interceptor"
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

// Email is what the model sends. The recipient and the kind of email are the target: a
// re-worded retry of the same email is the same call. The model learns these fields, their
// types and constraints from the tool's description, which toolfence writes from the schema.
type Email struct {
	To      string `json:"to" toolfence:"target" jsonschema:"format=email"`
	Kind    string `json:"kind" toolfence:"target" jsonschema:"enum=welcome,enum=invoice,enum=reminder"`
	Subject string `json:"subject" jsonschema:"maxLength=200"`
	Body    string `json:"body"`
}

// Sent is the email API's answer.
type Sent struct {
	ID     string `json:"id"`
	Status string `json:"status"`
}

// emailTool is the typed send_email tool against the email API at api; its client's
// transport forwards the key and classifies the answer.
func emailTool(api string, client *http.Client) (*tools.Typed[Email, Sent], error) {
	return tools.New("send_email", "Send an email.", func(ctx context.Context, in Email) (Sent, error) {
		body, _ := json.Marshal(in)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/messages", bytes.NewReader(body))
		if err != nil {
			return Sent{}, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return Sent{}, err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			return Sent{}, fmt.Errorf("email API answered %s: %s", resp.Status, raw)
		}
		var sent Sent
		return sent, json.Unmarshal(raw, &sent)
	}, tools.WithUpstreamName("the email API"))
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
	ic, err := interceptor.New(led, interceptor.Options{Holder: "onboarding-agent"})
	if err != nil {
		return err
	}
	send, err := emailTool(srv.URL, &http.Client{Transport: &tools.Transport{}, Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	// The key is (task, send_email, recipient and kind), whatever the wording.
	guarded := send.Tool(ic)
	ctx := interceptor.WithTask(context.Background(), task)
	fmt.Printf("the model sees the tool as %s: %s\n", guarded.Name(), guarded.Description())

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
