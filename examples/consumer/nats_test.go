package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// skipNATSEnv names the switch that turns a missing NATS server into a skip, outside CI.
const skipNATSEnv = "TOOLFENCE_SKIP_NATS"

var (
	natsOnce sync.Once
	natsErr  error
)

// requireNATS skips the test under -short (make check) and otherwise fails it loudly when no
// NATS server with JetStream answers at natsURL.
// Only an explicit TOOLFENCE_SKIP_NATS=1 outside CI turns that into a skip; with CI=true it
// always fails.
func requireNATS(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs NATS JetStream (NATS_URL)")
	}
	natsOnce.Do(func() { natsErr = pingJetStream(natsURL()) })
	if natsErr == nil {
		return
	}
	msg := fmt.Sprintf("THE NATS JETSTREAM TESTS DID NOT RUN: no JetStream server answers at NATS_URL=%q: %v "+
		"(start one, e.g. with .ci/run or `nats-server -js`, or set %s=1 outside CI to skip them)", natsURL(), natsErr, skipNATSEnv)
	if skipNATS(os.Getenv("CI"), os.Getenv(skipNATSEnv)) {
		t.Skip(msg)
	}
	t.Fatal(msg)
}

// skipNATS reports whether a missing NATS server skips the tests: only when skip is "1"
// and ci is not "true".
func skipNATS(ci, skip string) bool { return ci != "true" && skip == "1" }

// pingJetStream connects to url and asks for the JetStream account information.
func pingJetStream(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

func TestSkipNATSOnlyWhenAskedOutsideCI(t *testing.T) {
	t.Parallel()
	require.True(t, skipNATS("", "1"))
	require.False(t, skipNATS("true", "1"), "never under CI=true")
	require.False(t, skipNATS("", ""), "a missing server fails unless asked to skip")
	require.False(t, skipNATS("", "true"), "only the value 1 skips")
}
