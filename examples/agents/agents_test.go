package agents_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// binDir holds the examples built once for every test of the package.
var (
	binDir    string
	buildOnce sync.Once
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "toolfence-examples-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles the three examples with one go build (sharing its work), once.
func build(t *testing.T) {
	t.Helper()
	buildOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./payments", "./webhooks", "./email")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	require.NoError(t, buildErr)
}

// run executes one example and returns what it printed; it must exit 0.
func run(t *testing.T, name string) string {
	t.Helper()
	build(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, name)).CombinedOutput()
	t.Logf("%s printed:\n%s", name, out)
	require.NoError(t, err, "%s must exit 0", name)
	return string(out)
}

// counts parses the "upstream counts: a=1 b=2" line.
func counts(t *testing.T, out string) map[string]string {
	t.Helper()
	line := regexp.MustCompile(`(?m)^upstream counts: (.*)$`).FindStringSubmatch(out)
	require.NotNil(t, line, "no upstream counts line")
	got := map[string]string{}
	for _, m := range regexp.MustCompile(`(\w+)=(\d+)`).FindAllStringSubmatch(line[1], -1) {
		got[m[1]] = m[2]
	}
	return got
}

func TestPaymentsExample(t *testing.T) {
	t.Parallel()
	out := run(t, "payments")
	require.Equal(t, map[string]string{"charges": "1", "posts": "1", "lookups": "1"}, counts(t, out))
	require.Contains(t, out, "run 1 ended: signal: killed")
	require.Contains(t, out, "tool answered: blocked: a previous attempt may have reached the payment API; outcome unknown; do not retry — reconcile with toolfence (key tf1_")
	require.Regexp(t, `tool answered: settled: tf1_[0-9a-f]{64} was unknown and is now succeeded`, out)
	require.Regexp(t, `tool answered: \[replayed\] already done, outcome recorded at \S+: \{"id":"ch_1","invoice_id":"INV-42"`, out)
	require.Contains(t, out, `the model sees the tool as charge_invoice: Charge an invoice through the payment API, once. Input: a JSON object {"amount_cents" integer, required, minimum 1 (Amount in cents);`)
}

func TestWebhooksExample(t *testing.T) {
	t.Parallel()
	out := run(t, "webhooks")
	require.Equal(t, map[string]string{"deliveries": "1", "polls": "2"}, counts(t, out))
	require.Regexp(t, `still accepted: probe says accepted: job_1 is queued`, out)
	require.Regexp(t, `accepted → succeeded \(job_1 delivered\)`, out)
	require.Contains(t, out, `the model sees the tool as fire_webhook: Deliver an event to the shop's webhook endpoint. Input: a JSON object {"event_id" string, required; "order_id" string, required; "type" string, required, one of "order.shipped", "order.cancelled"; no other fields}`)
	require.Regexp(t, `tool answered: \[replayed\] already done, outcome recorded at \S+: \{"job_id":"job_1","event_id":"evt_7731_shipped","status":"delivered"\}`, out)
}

func TestEmailExample(t *testing.T) {
	t.Parallel()
	out := run(t, "email")
	require.Equal(t, map[string]string{"sent": "1"}, counts(t, out))
	require.Contains(t, out, `with different arguments; it was not repeated; the first result stands: {"id":"msg_1","status":"sent"}`)
	require.Contains(t, out, `the model sees the tool as send_email: Send an email. Input: a JSON object {"body" string, required; "kind" string, required, one of "welcome", "invoice", "reminder"; "subject" string, required, at most 200 characters; "to" string, required, format email; no other fields}`)
}
