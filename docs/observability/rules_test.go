package observability

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/toolfence/toolfence/internal/testkit"
)

// promtool returns the path of promtool, skipping the test when it is missing outside CI;
// under CI=true a missing promtool fails the test (.ci/run installs Debian's prometheus
// package, which provides it).
func promtool(t *testing.T) string {
	t.Helper()
	testkit.SkipShort(t, "needs promtool")
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("promtool is not installed: CI must install it (apt-get install prometheus; see .ci/run)")
	}
	t.Skip("promtool is not installed (apt-get install prometheus); the rules are not checked")
	return ""
}

// TestRulesCheck runs `promtool check rules` on the alerting rules.
func TestRulesCheck(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", "toolfence.rules.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestRulesUnit runs the rules' unit tests with `promtool test rules`.
func TestRulesUnit(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", "toolfence.rules.test.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestDashboard checks that the Grafana dashboard is JSON and queries only metrics that
// docs/observability.md documents.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile("toolfence.dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	doc, err := os.ReadFile("../observability.md")
	if err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || len(d.Panels) == 0 {
		t.Fatal("dashboard has no title or no panels")
	}
	metric := regexp.MustCompile(`toolfence_[a-z_]+`)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, m := range metric.FindAllString(q.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if !strings.Contains(string(doc), "`"+base) {
					t.Errorf("panel %q queries %s, which docs/observability.md does not document", p.Title, m)
				}
			}
		}
	}
}
