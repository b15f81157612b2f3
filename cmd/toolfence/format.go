package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/toolfence/toolfence/residual"
)

// timeNow is the clock of the commands' human output (how long until a lease expires).
var timeNow = time.Now

const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(timeLayout)
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// residualJSON is a residual as ls --json, show --json and resolve --json print it: every
// field of the record, with the cached result and the evidence results as JSON values when
// they hold JSON and as JSON strings otherwise (as inspect_residual shows them over MCP),
// never as base64.
type residualJSON struct {
	*residual.Residual
	Result   json.RawMessage `json:"result,omitempty"`
	Evidence []evidenceJSON  `json:"evidence,omitempty"`
}

// evidenceJSON is residual.Evidence with its result as in residualJSON.
type evidenceJSON struct {
	residual.Evidence
	Result json.RawMessage `json:"result,omitempty"`
}

// toJSON returns r in the shape residualJSON describes.
func toJSON(r *residual.Residual) residualJSON {
	out := residualJSON{Residual: r, Result: jsonValue(r.Result)}
	for _, e := range r.Evidence {
		out.Evidence = append(out.Evidence, evidenceJSON{Evidence: e, Result: jsonValue(e.Result)})
	}
	return out
}

// jsonValue returns b when it is a JSON value, b as a JSON string when it is other UTF-8
// text, nil when b is empty, and otherwise a JSON string saying how many bytes b holds.
func jsonValue(b []byte) json.RawMessage {
	switch {
	case len(b) == 0:
		return nil
	case json.Valid(b):
		return b
	}
	q, _ := json.Marshal(printable(b))
	return q
}

// writeResidualJSON writes r as indented JSON (show and resolve --json).
func writeResidualJSON(w io.Writer, r *residual.Residual) error {
	b, err := json.MarshalIndent(toJSON(r), "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// safe returns s for a terminal: control characters (C0, DEL and C1, which include ESC,
// newlines and tabs) and the Unicode bidirectional and line-separator controls are shown as
// Go escapes (\x1b, \n, \u202e), bytes that are not UTF-8 as \xff, and a backslash already in s as \\ when s needs any
// escape, so agent-supplied text cannot move the cursor, forge lines or set the terminal's
// title. Text without such characters is returned as is.
func safe(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for len(s) > 0 {
		c, size := utf8.DecodeRuneInString(s)
		switch {
		case c == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case c == '\\':
			b.WriteString(`\\`)
		case isControl(c):
			q := strconv.QuoteRune(c)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[:size])
		}
		s = s[size:]
	}
	return b.String()
}

func needsEscape(s string) bool {
	if !utf8.ValidString(s) {
		return true
	}
	for _, c := range s {
		if isControl(c) {
			return true
		}
	}
	return false
}

// isControl reports whether c changes how a terminal shows what follows: C0 and C1 controls,
// DEL, and the bidirectional overrides, isolates and marks and the line and paragraph
// separators of Unicode.
func isControl(c rune) bool {
	switch {
	case c < 0x20, c >= 0x7f && c < 0xa0:
		return true
	case c >= 0x200e && c <= 0x200f, c >= 0x2028 && c <= 0x202e, c >= 0x2066 && c <= 0x2069, c == 0x061c:
		return true
	}
	return false
}

// displayStore returns store with any password of a DSN masked, for messages.
func displayStore(store string) string {
	if !isDSN(store) {
		return store
	}
	u, err := url.Parse(store)
	if err != nil {
		return "postgres://…"
	}
	return u.Redacted()
}

// printable returns b as text when it is valid UTF-8, and a placeholder otherwise.
func printable(b []byte) string {
	if !utf8.Valid(b) {
		return fmt.Sprintf("(%d bytes, not UTF-8; see --json)", len(b))
	}
	return string(b)
}

// until says how long from now until t, for lease expiries.
func until(t, now time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return fmt.Sprintf("expired %v ago", (-d).Round(time.Millisecond))
	}
	return fmt.Sprintf("expires in %v", d.Round(time.Millisecond))
}

// writeResidual prints r for people. Every text an agent or a person supplied (task,
// target, holder, notes, evidence, results) goes through safe, so it cannot drive the
// terminal.
func writeResidual(w io.Writer, r *residual.Residual, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s\t%s\n", name, safe(value))
		}
	}
	field("key", r.Key)
	field("namespace", r.Namespace)
	field("task", r.Task)
	field("operation", r.Operation)
	field("target", r.Target)
	field("state", r.State.String())
	field("token", fmt.Sprintf("%d (highest fencing token issued)", r.Token))
	field("created", stamp(r.CreatedAt))
	field("updated", stamp(r.UpdatedAt))
	field("request digest", r.RequestDigest)
	if r.Result != nil {
		res := printable(r.Result)
		if r.ResultTruncated {
			res += " …(truncated at the result cap)"
		}
		field("result", res)
	}
	field("result digest", r.ResultDigest)
	field("handle", r.Handle)
	if err := tw.Flush(); err != nil {
		return err
	}

	if n := r.AttemptCount; n > len(r.Attempts) {
		fmt.Fprintf(w, "\nattempts (%d; the first and the latest %d are kept)\n", n, len(r.Attempts)-1)
	} else {
		fmt.Fprintf(w, "\nattempts (%d)\n", len(r.Attempts))
	}
	for _, at := range r.Attempts {
		outcome := at.Outcome.String()
		if at.Outcome == residual.None {
			outcome = "none yet"
		}
		fmt.Fprintf(w, "  #%d  token %d  holder %s\n", at.N, at.Token, safe(at.Holder))
		fmt.Fprintf(w, "      started %s  lease until %s", stamp(at.Started), stamp(at.LeaseExpires))
		if at.Outcome == residual.None && !at.Released {
			fmt.Fprintf(w, " (%s)", until(at.LeaseExpires, now))
		}
		fmt.Fprintf(w, "\n      outcome %s  ended %s", outcome, stamp(at.Ended))
		if at.Released {
			fmt.Fprint(w, "  released")
		}
		fmt.Fprintln(w)
		if at.ResponseDigest != "" {
			fmt.Fprintf(w, "      response digest %s\n", safe(at.ResponseDigest))
		}
		if at.Error != "" {
			fmt.Fprintf(w, "      error: %s\n", safe(at.Error))
		}
	}

	if len(r.Evidence) > 0 {
		fmt.Fprintf(w, "\nevidence from fenced-out holders (%d)\n", len(r.Evidence))
		for _, e := range r.Evidence {
			fmt.Fprintf(w, "  %s  holder %s  token %d  observed %s\n", stamp(e.At), safe(e.Holder), e.Token, e.Outcome)
			if e.Result != nil {
				fmt.Fprintf(w, "      result: %s\n", safe(printable(e.Result)))
			}
			if e.Handle != "" {
				fmt.Fprintf(w, "      handle: %s\n", safe(e.Handle))
			}
			if e.Note != "" {
				fmt.Fprintf(w, "      note: %s\n", safe(e.Note))
			}
		}
	}

	if len(r.Resolutions) > 0 {
		fmt.Fprintf(w, "\nresolutions (%d)\n", len(r.Resolutions))
		for _, res := range r.Resolutions {
			fmt.Fprintf(w, "  %s  %s → %s  by %s  token %d\n", stamp(res.At), res.From, res.To, safe(res.By), res.Token)
			if res.Note != "" {
				fmt.Fprintf(w, "      note: %s\n", safe(res.Note))
			}
			if res.Evidence != "" {
				fmt.Fprintf(w, "      evidence: %s\n", safe(res.Evidence))
			}
		}
	}

	if next := nextStep(r, now); next != "" {
		fmt.Fprintf(w, "\nnext: %s\n", next)
	}
	return nil
}

// nextStep says what recovery an open residual needs.
func nextStep(r *residual.Residual, now time.Time) string {
	switch r.State {
	case residual.Pending:
		cur := r.Current()
		if cur == nil {
			return ""
		}
		return fmt.Sprintf("in progress: %s holds the lease until %s (%s); the call may be in flight. Wait; once the lease expires it reads as unknown",
			safe(cur.Holder), stamp(cur.LeaseExpires), until(cur.LeaseExpires, now))
	case residual.Unknown:
		return "the last attempt may have reached upstream and nobody recorded the outcome: find out what happened upstream, then " +
			"`toolfence resolve " + r.Key + " --as succeeded|failed --note TEXT`"
	case residual.Accepted:
		h := safe(r.Handle)
		if h == "" {
			h = "(no handle recorded)"
		}
		return "upstream accepted the call but has not finished it: poll " + h + ", then " +
			"`toolfence resolve " + r.Key + " --as succeeded|failed --note TEXT`"
	}
	return ""
}
