package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/lease"
	"github.com/toolfence/toolfence/ledger/badger"
)

// natsURL is the JetStream server the tests use (.ci/run starts it on 127.0.0.1:4222).
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// testConfig returns a config on a stream and subject unique to this test run; the stream
// is deleted at cleanup. It fails the test loudly when JetStream does not answer (see
// requireNATS).
func testConfig(t *testing.T) config {
	t.Helper()
	requireNATS(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	c := config{
		url: natsURL(), stream: "TFTEST_" + id, subject: "tftest." + id + ".orders", durable: "billing",
		store: t.TempDir(), workers: 8, hold: 200 * time.Millisecond, ackWait: time.Second,
	}
	t.Cleanup(func() {
		nc, err := nats.Connect(c.url)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = js.DeleteStream(ctx, c.stream)
		}
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("cleanup: delete stream %s: %v", c.stream, err)
		}
	})
	return c
}

func (c config) args() []string {
	return []string{
		"-nats", c.url, "-stream", c.stream, "-subject", c.subject, "-durable", c.durable,
		"-store", c.store, "-workers", strconv.Itoa(c.workers), "-hold", c.hold.String(),
		"-ack-wait", c.ackWait.String(),
	}
}

// The example end to end on the local JetStream: 1,000 messages for 700 orders, 300 of them
// re-published under new message ids, consumed by 8 concurrent consumers: every order is
// billed exactly once and every message is acknowledged.
func TestRunBillsEachOrderOnce(t *testing.T) {
	t.Parallel()
	c := testConfig(t)
	c.ackWait = 10 * time.Second
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, run(ctx, append(c.args(), "-publish", "1000"), &out))
	t.Logf("%s(in %v)", out.String(), time.Since(start).Round(time.Millisecond))
	m := regexp.MustCompile(`published 1000 messages for 700 orders; billed 700 orders, 0 more than once; duplicates acked without billing: (\d+); dead letters: 0`).
		FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	dups, _ := strconv.Atoi(m[1])
	require.GreaterOrEqual(t, dups, 300)
}

// Lost acknowledgements: the consumer bills an order and its ack never reaches the server,
// so JetStream redelivers the message after the ack wait; the guard acknowledges the
// redelivery without billing again.
func TestLostAcksAreRedeliveredAsDuplicates(t *testing.T) {
	t.Parallel()
	c := testConfig(t)
	ctx := t.Context()
	nc, js, cons, err := setup(ctx, c)
	require.NoError(t, err)
	defer nc.Close()
	_, ic := openLedger(t, c.store, lease.Real{})
	bill := &billing{charges: map[string]int{}}
	guard, err := consumer.Guard(ic, bill.handle, consumer.Options{Group: c.durable, Key: orderKey, RetryAfter: 100 * time.Millisecond})
	require.NoError(t, err)
	a := &adapter{guard: guard, hold: c.hold, log: slog.New(slog.DiscardHandler)}

	distinct, err := publishOrders(ctx, js, c.subject, 200)
	require.NoError(t, err)
	var lost atomic.Int64
	for range 4 {
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			o := a.process(msg)
			if o.Ran && lost.Load() < 20 && lost.Add(1) <= 20 {
				return // the ack is lost
			}
			a.settle(msg, o)
		})
		require.NoError(t, err)
		defer func() { cc.Drain(); <-cc.Closed() }()
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, waitDrained(wctx, cons))
	charged, twice := bill.counts()
	require.Equal(t, distinct, charged)
	require.Zero(t, twice, "no order was billed twice")
	require.EqualValues(t, 20, lost.Load())
	require.GreaterOrEqual(t, a.duplicates.Load(), int64(200-distinct+20), "re-publishes and redeliveries were acked as duplicates")
	require.Zero(t, a.deadLetters.Load())
}

func openLedger(t *testing.T, dir string, clock lease.Clock) (*badger.Ledger, *interceptor.Interceptor) {
	t.Helper()
	l, err := badger.Open(dir, badger.Options{Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ic, err := interceptor.New(l, interceptor.Options{Namespace: "consumer-example", Clock: clock})
	require.NoError(t, err)
	return l, ic
}

func TestParseFlags(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, err := parse([]string{"-workers", "0"}, &out)
	require.Error(t, err)
	c, err := parse(nil, &out)
	require.NoError(t, err)
	require.Equal(t, nats.DefaultURL, c.url)
	_, err = orderKey(consumer.Message{Body: []byte(`{}`)})
	require.Error(t, err)
	k, err := orderKey(consumer.Message{Body: []byte(`{"order":"o-1"}`)})
	require.NoError(t, err)
	require.Equal(t, "order:o-1", k)
}
