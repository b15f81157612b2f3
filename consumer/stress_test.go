package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/lease"
)

// Seed 003's stress checkpoint: 10,000 deliveries, 30 % of them duplicates (half broker
// redeliveries with the same message id, half producer re-publishes under a new message id
// with the same business id), to 50 concurrent consumers sharing one guard on one badger
// ledger with group commit. Every distinct message has exactly one effect, every delivery
// ends acknowledged, and the duplicates are acknowledged without running the handler.
func TestTenThousandDeliveriesWithDuplicates(t *testing.T) {
	t.Parallel()
	const (
		total     = 10_000
		distinct  = 7_000
		consumers = 50
	)
	f := setup(t, lease.Real{}, t.TempDir())
	effects := make([]atomic.Int32, distinct)
	g := f.guard(func(ctx context.Context, m consumer.Message) error {
		n, err := strconv.Atoi(m.Header["Order-Seq"][0])
		if err != nil {
			return err
		}
		effects[n].Add(1)
		return nil
	}, consumer.Options{Key: orderKey})

	// The deliveries: every distinct message once, plus 3,000 duplicates, shuffled.
	rng := rand.New(rand.NewPCG(3, 30))
	deliveries := make([]consumer.Message, 0, total)
	for i := range distinct {
		deliveries = append(deliveries, order(i, fmt.Sprintf("m-%d", i)))
	}
	for d := range total - distinct {
		i := rng.IntN(distinct)
		id := fmt.Sprintf("m-%d", i) // a broker redelivery
		if d%2 == 1 {
			id = fmt.Sprintf("m-%d-republished-%d", i, d) // a producer re-publish
		}
		deliveries = append(deliveries, order(i, id))
	}
	rng.Shuffle(len(deliveries), func(a, b int) { deliveries[a], deliveries[b] = deliveries[b], deliveries[a] })

	// The broker: a queue that redelivers what the consumers do not acknowledge.
	queue := make(chan consumer.Message, total)
	for _, m := range deliveries {
		queue <- m
	}
	var (
		outstanding              sync.WaitGroup
		ran, duplicates, retries atomic.Int64
	)
	outstanding.Add(total)
	go func() { outstanding.Wait(); close(queue) }()

	start := time.Now()
	var workers sync.WaitGroup
	for range consumers {
		workers.Go(func() {
			for m := range queue {
				o := g.Handle(context.Background(), m)
				switch o.Verdict {
				case consumer.Ack:
					if o.Ran {
						ran.Add(1)
					}
					if o.Duplicate {
						duplicates.Add(1)
					}
					outstanding.Done()
				case consumer.Retry: // another consumer holds the key: redeliver
					retries.Add(1)
					queue <- m
				default:
					t.Errorf("delivery %s: %s: %v", m.ID, o.Verdict, o.Err)
					outstanding.Done()
				}
			}
		})
	}
	workers.Wait()
	elapsed := time.Since(start)
	t.Logf("%d deliveries (%d distinct) to %d consumers in %v (%.0f deliveries/s); %d redelivered while in flight",
		total, distinct, consumers, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), retries.Load())

	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Fatalf("order %d had %d effects, want exactly 1", i, n)
		}
	}
	require.EqualValues(t, distinct, ran.Load(), "the handler ran once per distinct message")
	require.EqualValues(t, total-distinct, duplicates.Load(), "every duplicate was acked without running")
	require.Empty(t, f.deadLetters())
}

func order(i int, id string) consumer.Message {
	return consumer.Message{
		ID: id, Subject: "orders.created",
		Header: map[string][]string{"Order-Seq": {strconv.Itoa(i)}},
		Body:   fmt.Appendf(nil, `{"order":"o-%d","amount":%d}`, i, 100+i%900),
	}
}
