package transport

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/internal/testkit"
)

// upstreamRoles are upstreams that end in different ways once their stdin is closed; each
// records what happened to it in the file $TF_RECORD.
var upstreamRoles = map[string]func() int{
	// goodbye reads stdin to its end, then writes a last line on stdout and exits 0: the
	// MCP shutdown a server expects.
	"goodbye": func() int {
		ready()
		_, _ = io.Copy(io.Discard, os.Stdin)
		// Ignored, so that a closed pipe shows as a write error, not a death by SIGPIPE.
		signal.Ignore(syscall.SIGPIPE)
		_, err := fmt.Fprintln(os.Stdout, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"bye"}}`)
		record(fmt.Sprint("write: ", err))
		return 0
	},
	// lingerer does not exit on the end of stdin; it exits 3 on SIGTERM.
	"lingerer": func() int { awaitSIGTERM(); return 3 },
	// stubborn ignores both the end of stdin and SIGTERM.
	"stubborn": func() int { awaitSIGTERM(); select {} },
}

// awaitSIGTERM says ready, ignores the end of stdin and records a SIGTERM when it comes.
func awaitSIGTERM() {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	ready()
	<-term
	record("sigterm")
}

// ready tells the test, on stdout, that the role runs (and listens for SIGTERM if it does).
func ready() {
	fmt.Println(`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"ready"}}`)
}

// record appends line to $TF_RECORD.
func record(line string) {
	f, err := os.OpenFile(os.Getenv("TF_RECORD"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		os.Exit(5)
	}
	defer f.Close()
	_, _ = fmt.Fprintln(f, line)
}

// TestUpstreamCloseShutsDownInOrder: Close follows the MCP stdio shutdown. It closes the
// child's stdin and reads its stdout to the end, so a child that answers the end of its
// input with a last message writes it and exits 0; one that keeps running gets SIGTERM
// after the exit grace; one that ignores SIGTERM gets SIGKILL after the term grace.
func TestUpstreamCloseShutsDownInOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		role, state, record string
	}{
		{"goodbye", "exit status 0", "write: <nil>\n"},
		{"lingerer", "exit status 3", "sigterm\n"},
		{"stubborn", "signal: killed", "sigterm\n"},
	} {
		t.Run(tc.role, func(t *testing.T) {
			t.Parallel()
			rec := filepath.Join(t.TempDir(), "record")
			up, err := StartUpstream(t.Context(), []string{"env", testkit.WithRole(tc.role), "TF_RECORD=" + rec,
				"GORACE=atexit_sleep_ms=0", os.Args[0]}, os.Stderr)
			require.NoError(t, err)
			up.Stop = StopGrace{Exit: time.Second, Term: time.Second}
			// GORACE: a -race child otherwise sleeps 1 s before it exits. Close only once
			// the child runs (and listens for SIGTERM): the graces are for its shutdown,
			// not its start.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err = up.Conn().Read(ctx)
			require.NoError(t, err)
			start := time.Now()
			require.NoError(t, up.Close())
			state, ok := up.Exit(time.Second)
			require.True(t, ok, "Close returns once the child has exited")
			b, _ := os.ReadFile(rec)
			require.Equal(t, tc.state, state, "recorded: %q", b)
			require.Equal(t, tc.record, string(b))
			require.Less(t, time.Since(start), 5*time.Second, "the graces bound Close")
		})
	}
}
