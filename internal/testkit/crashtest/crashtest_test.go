package crashtest_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/toolfence/toolfence/internal/testkit/crashtest"
)

func TestMain(m *testing.M) {
	if crashtest.Role() != "" {
		os.Exit(m.Run()) // a child is killed: it cannot pass a leak check
	}
	goleak.VerifyTestMain(m)
}

const detailEnv = "CRASHTEST_TEST_DETAIL"

// TestCrashChild is the child of the tests below; it returns at once in a normal run.
func TestCrashChild(t *testing.T) {
	crashtest.Run(t, map[string]func(t *testing.T){
		"ready": func(t *testing.T) {
			fmt.Println("stdout is not a mark channel: ready fake")
			crashtest.Mark("one", "")
			crashtest.Mark("two", "x y")
			crashtest.Mark("ready", os.Getenv(detailEnv))
			crashtest.Hang()
		},
		"exit": func(t *testing.T) {
			crashtest.Mark("early", "")
			fmt.Fprintln(os.Stderr, "about to exit on my own")
			os.Exit(0)
		},
		"ticker": func(t *testing.T) {
			crashtest.Mark("ready", "")
			for i := 0; ; i++ {
				crashtest.Mark("tick", strconv.Itoa(i))
				time.Sleep(time.Millisecond) // pacing only: the parent never waits on a duration
			}
		},
	})
}

func TestAwaitReturnsTheDetailAndKillIsARealKill(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, "ready", detailEnv+"=listening on 127.0.0.1:1")
	require.Equal(t, "x y", c.Await("two"))
	require.Equal(t, "listening on 127.0.0.1:1", c.Await("ready"), "stdout lines are not marks")
	require.Empty(t, c.Kill(), "nothing was marked after ready")
	require.Contains(t, c.Output(), "stdout is not a mark channel")
}

// recorder stands in for the test where a harness failure is the expected result: Fatalf
// records the message and ends the goroutine, as testing.T does.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// fails runs f on its own goroutine and returns the failure message it recorded ("" if none).
func (r *recorder) fails(f func()) string {
	r.msg = ""
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	return r.msg
}

func TestAwaitReportsAChildThatExitedWithItsOutput(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	c := crashtest.Start(r, "exit")
	msg := r.fails(func() { c.Await("ready") })
	require.Contains(t, msg, `child exit exited (<nil>) before it marked "ready"`)
	require.Contains(t, msg, `marks ["early"]`)
	require.Contains(t, msg, "about to exit on my own", "the failure carries the child's output")

	msg = r.fails(func() { c.Kill() })
	require.Contains(t, msg, "before it was killed", "a child that exited on its own did not crash")
}

func TestUnknownRoleFailsLoudly(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	c := crashtest.Start(r, "no-such-role")
	msg := r.fails(func() { c.Await("ready") })
	require.Contains(t, msg, `unknown role "no-such-role"`)
	require.Contains(t, msg, `["exit" "ready" "ticker"]`)
}

func TestStopAndContinue(t *testing.T) {
	t.Parallel()
	c := crashtest.Start(t, "ticker")
	c.Await("ready")
	c.Stop()
	if runtime.GOOS == "linux" {
		require.Equal(t, "T", procState(t, c.Pid()), "Stop returns once the child is stopped")
	}
	c.Continue()
	if runtime.GOOS == "linux" {
		require.NotEqual(t, "T", procState(t, c.Pid()), "Continue returns once the child runs again")
	}
	c.Await("tick")
	c.Stop()
	c.Kill() // a stopped child can be killed
}

// procState returns the state letter of pid from /proc (R, S, T, …).
func procState(t *testing.T, pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	require.Positive(t, i, s)
	return strings.Fields(s[i+1:])[0]
}
