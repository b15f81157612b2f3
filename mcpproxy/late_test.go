package mcpproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/mcpproxy"
	"github.com/toolfence/toolfence/residual"
)

// wireMsg is any JSON-RPC message as it crossed a pipe.
type wireMsg struct {
	ID     any             `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
}

// TestProxyDropsLateAnswersToItsOwnRequests: over stdio, when the proxy's own upstream
// request (a protected tools/call) ends before upstream answers (the timeout), upstream's
// late answer carries an id of the proxy's reserved space that no one waits for any more:
// it is dropped (and logged with its id), never relayed to the host, which only ever sees
// the proxy's unknown-outcome answer for its own call. (The host's cancellation does not
// end the proxy's request: TestProxyHostCancellationLetsTheCallFinish.)
func TestProxyDropsLateAnswersToItsOwnRequests(t *testing.T) {
	for _, c := range []struct {
		name    string
		timeout time.Duration
		end     func(t *testing.T, hostW *os.File) // ends the proxy's request before upstream answers
	}{
		{"timeout", 200 * time.Millisecond, func(*testing.T, *os.File) {}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			logs := &lockedBuffer{}
			ps := newPipeSession(t, interceptor.Options{LeaseTTL: 5 * time.Second}, mcpproxy.Options{ServerID: "fx", Timeout: c.timeout,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			hostW, upOut, served := ps.hostW, ps.upW, ps.served
			// Every line the proxy writes, on either side, read until its pipe ends.
			lines := func(f *os.File) <-chan string {
				ch := make(chan string, 64)
				go func() {
					defer close(ch)
					r := bufio.NewReader(f)
					for {
						s, err := r.ReadString('\n')
						if err != nil {
							return
						}
						ch <- s
					}
				}()
				return ch
			}
			hostLines, upLines := lines(ps.hostR), lines(ps.upR)
			next := func(ch <-chan string, side string) (wireMsg, string) {
				t.Helper()
				select {
				case s, ok := <-ch:
					require.True(t, ok, "the %s's pipe ended", side)
					var m wireMsg
					require.NoError(t, json.Unmarshal([]byte(s), &m), s)
					if side == "host" {
						id, _ := m.ID.(string)
						require.False(t, strings.HasPrefix(id, mcpproxy.ReservedIDPrefix),
							"the host got a message with the proxy's reserved id: %s", s)
					}
					return m, s
				case <-time.After(10 * time.Second):
					t.Fatalf("no line for the %s", side)
				}
				return wireMsg{}, ""
			}
			write := func(f *os.File, line string) {
				t.Helper()
				_, err := f.WriteString(line + "\n")
				require.NoError(t, err)
			}

			write(hostW, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"charge","arguments":{"order":"A"}}}`)
			list, _ := next(upLines, "upstream")
			require.Equal(t, "tools/list", list.Method)
			lid, _ := json.Marshal(list.ID)
			write(upOut, `{"jsonrpc":"2.0","id":`+string(lid)+`,"result":{"tools":[`+chargeDef+`]}}`)
			guarded, _ := next(upLines, "upstream")
			require.Equal(t, "tools/call", guarded.Method)
			gid, _ := guarded.ID.(string)
			require.Regexp(t, proxyID, gid)

			// The proxy's request ends; it tells upstream so (after it stopped waiting).
			c.end(t, hostW)
			note, _ := next(upLines, "upstream")
			require.Equal(t, "notifications/cancelled", note.Method)
			require.JSONEq(t, `"`+gid+`"`, string(mustField(t, note.Params, "requestId")))

			// The host gets exactly the proxy's answer for its call: unknown outcome.
			answer, raw := next(hostLines, "host")
			require.EqualValues(t, 1, answer.ID, raw)
			require.Contains(t, string(answer.Result), `"isError":true`)
			require.Contains(t, string(answer.Result), string(interceptor.UnknownOutcome))

			// Upstream answers late, then sends a notification: the notification is the
			// host's next line, so the late answer was read (in order) and not relayed.
			write(upOut, `{"jsonrpc":"2.0","id":"`+gid+`","result":{"content":[{"type":"text","text":"charged late"}]}}`)
			write(upOut, `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"after the late answer"}}`)
			after, raw := next(hostLines, "host")
			require.Equal(t, "notifications/message", after.Method, raw)
			require.Contains(t, logs.String(), gid, "the dropped answer is logged with its id")
			// With the key it is the evidence for, and what upstream answered.
			m := regexp.MustCompile(`key=(tf1_[0-9a-f]+) answer=succeeded`).FindStringSubmatch(logs.String())
			require.NotNil(t, m, logs.String())
			r, err := ps.l.Get(context.Background(), ledger.GetParams{Namespace: ps.ic.Namespace(), Key: m[1]})
			require.NoError(t, err)
			require.Equal(t, residual.Unknown, r.State, "the logged key is the call left unknown")

			// Nothing else reaches the host until the session ends.
			require.NoError(t, hostW.Close())
			select {
			case err := <-served:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not end when the host closed its side")
			}
			require.NoError(t, ps.proxyOut.Close())
			for s := range hostLines {
				t.Errorf("the host got another line: %s", s)
			}
		})
	}
}

// mustField is the raw value of a key of a JSON object.
func mustField(t *testing.T, obj json.RawMessage, key string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(obj, &m), string(obj))
	v, ok := m[key]
	require.True(t, ok, "no %q in %s", key, obj)
	return v
}
