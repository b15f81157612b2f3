package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
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

// writeResidual prints r for people.
func writeResidual(w io.Writer, r *residual.Residual, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	field := func(name, value string) {
		if value != "" {
			fmt.Fprintf(tw, "%s\t%s\n", name, value)
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

	fmt.Fprintf(w, "\nattempts (%d)\n", len(r.Attempts))
	for _, at := range r.Attempts {
		outcome := at.Outcome.String()
		if at.Outcome == residual.None {
			outcome = "none yet"
		}
		fmt.Fprintf(w, "  #%d  token %d  holder %s\n", at.N, at.Token, at.Holder)
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
			fmt.Fprintf(w, "      response digest %s\n", at.ResponseDigest)
		}
		if at.Error != "" {
			fmt.Fprintf(w, "      error: %s\n", at.Error)
		}
	}

	if len(r.Evidence) > 0 {
		fmt.Fprintf(w, "\nevidence from fenced-out holders (%d)\n", len(r.Evidence))
		for _, e := range r.Evidence {
			fmt.Fprintf(w, "  %s  holder %s  token %d  observed %s\n", stamp(e.At), e.Holder, e.Token, e.Outcome)
			if e.Result != nil {
				fmt.Fprintf(w, "      result: %s\n", printable(e.Result))
			}
			if e.Handle != "" {
				fmt.Fprintf(w, "      handle: %s\n", e.Handle)
			}
			if e.Note != "" {
				fmt.Fprintf(w, "      note: %s\n", e.Note)
			}
		}
	}

	if len(r.Resolutions) > 0 {
		fmt.Fprintf(w, "\nresolutions (%d)\n", len(r.Resolutions))
		for _, res := range r.Resolutions {
			fmt.Fprintf(w, "  %s  %s → %s  by %s  token %d\n", stamp(res.At), res.From, res.To, res.By, res.Token)
			if res.Note != "" {
				fmt.Fprintf(w, "      note: %s\n", res.Note)
			}
			if res.Evidence != "" {
				fmt.Fprintf(w, "      evidence: %s\n", res.Evidence)
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
			cur.Holder, stamp(cur.LeaseExpires), until(cur.LeaseExpires, now))
	case residual.Unknown:
		return "the last attempt may have reached upstream and nobody recorded the outcome: find out what happened upstream, then " +
			"`toolfence resolve " + r.Key + " --as succeeded|failed --note TEXT`"
	case residual.Accepted:
		h := r.Handle
		if h == "" {
			h = "(no handle recorded)"
		}
		return "upstream accepted the call but has not finished it: poll " + h + ", then " +
			"`toolfence resolve " + r.Key + " --as succeeded|failed --note TEXT`"
	}
	return ""
}
