// Command consumer bills orders read from a NATS JetStream stream, each exactly once, with
// consumer.Guard over the embedded badger ledger: redeliveries and producer re-publishes are
// acknowledged without billing again, and a delivery whose outcome is unknown (the process
// died mid-handler) is dead-lettered and held until it is reconciled, never acknowledged.
//
//	nats-server -js &
//	cd examples/consumer && go run . -publish 1000 -workers 8 -store /tmp/tf-consumer
//
// With -publish N it first publishes N orders, 30 % of them duplicates (re-published under a
// new message id), consumes until everything is acknowledged and prints a summary; without
// it, it consumes until interrupted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	url, stream, subject, durable, store string
	workers, publish                     int
	hold, ackWait                        time.Duration
}

func parse(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("consumer", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.url, "nats", nats.DefaultURL, "NATS server URL")
	fs.StringVar(&c.stream, "stream", "ORDERS", "JetStream stream (created when missing)")
	fs.StringVar(&c.subject, "subject", "orders.created", "subject of the orders")
	fs.StringVar(&c.durable, "durable", "billing", "durable consumer name: the consumer group that bills each order once")
	fs.StringVar(&c.store, "store", ".toolfence/consumer", "badger ledger directory")
	fs.IntVar(&c.workers, "workers", 4, "concurrent consumers")
	fs.IntVar(&c.publish, "publish", 0, "publish this many demo orders first (30 % duplicates), consume them all and exit")
	fs.DurationVar(&c.hold, "hold", time.Minute, "redelivery delay of dead-lettered messages (they wait for reconciliation)")
	fs.DurationVar(&c.ackWait, "ack-wait", 30*time.Second, "JetStream ack wait: redelivery after a consumer died")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.workers < 1 {
		return c, errors.New("-workers must be at least 1")
	}
	return c, nil
}

// order is the message payload.
type order struct {
	Order  string `json:"order"`
	Amount int    `json:"amount_cents"`
}

// orderKey is the business id of a message: a re-published order is the same order.
func orderKey(m consumer.Message) (string, error) {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return "", err
	}
	if o.Order == "" {
		return "", errors.New("no order id in the payload")
	}
	return "order:" + o.Order, nil
}

// billing is the effect: it charges an order. It counts charges per order, so a duplicate
// effect would show.
type billing struct {
	mu      sync.Mutex
	charges map[string]int
}

func (b *billing) handle(ctx context.Context, m consumer.Message) error {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return interceptor.NoEffect(err) // malformed: nothing was charged
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.charges[o.Order]++
	return nil
}

// counts returns how many orders were charged and how many of them more than once.
func (b *billing) counts() (charged, twice int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range b.charges {
		charged++
		if n > 1 {
			twice++
		}
	}
	return charged, twice
}

// setup connects to NATS and creates the stream and the durable consumer when missing.
func setup(ctx context.Context, c config) (*nats.Conn, jetstream.JetStream, jetstream.Consumer, error) {
	nc, err := nats.Connect(c.url, nats.Name("toolfence-consumer-example"))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("connect %s: %w", c.url, err)
	}
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: c.stream, Subjects: []string{c.subject}})
	}
	var cons jetstream.Consumer
	if err == nil {
		cons, err = js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{
			Durable: c.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: c.ackWait,
			FilterSubject: c.subject, MaxDeliver: -1,
		})
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("stream %s: %w", c.stream, err)
	}
	return nc, js, cons, nil
}

// publishOrders publishes n messages for about 0.7·n orders: every order once under its own
// message id, the rest re-publishes of random orders under new message ids (so JetStream's
// own de-duplication does not catch them). It returns the number of distinct orders.
func publishOrders(ctx context.Context, js jetstream.JetStream, subject string, n int) (int, error) {
	distinct := max(1, n*7/10)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for i := range n {
		o := i
		if i >= distinct {
			o = rng.IntN(distinct)
		}
		body, _ := json.Marshal(order{Order: fmt.Sprintf("o-%d", o), Amount: 100 + o%900})
		if _, err := js.PublishMsg(ctx, &nats.Msg{
			Subject: subject, Data: body,
			Header: nats.Header{jetstream.MsgIDHeader: {fmt.Sprintf("o-%d#%d", o, i)}},
		}); err != nil {
			return 0, fmt.Errorf("publish: %w", err)
		}
	}
	return distinct, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parse(args, out)
	if err != nil {
		return err
	}
	nc, js, cons, err := setup(ctx, c)
	if err != nil {
		return err
	}
	defer nc.Close()
	l, err := badger.Open(c.store, badger.Options{})
	if err != nil {
		return err
	}
	defer l.Close()
	ic, err := interceptor.New(l, interceptor.Options{Namespace: "consumer-example"})
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(out, nil))
	bill := &billing{charges: map[string]int{}}
	guard, err := consumer.Guard(ic, bill.handle, consumer.Options{
		Group: c.durable, Key: orderKey,
		OnDeadLetter: func(ctx context.Context, m consumer.Message, o consumer.Outcome) {
			log.Warn("dead letter: outcome unknown, held for reconciliation", "id", m.ID, "key", o.Key, "err", o.Err)
		},
	})
	if err != nil {
		return err
	}
	a := &adapter{guard: guard, hold: c.hold, log: log}

	distinct := 0
	if c.publish > 0 {
		if distinct, err = publishOrders(ctx, js, c.subject, c.publish); err != nil {
			return err
		}
	}
	var running []jetstream.ConsumeContext
	defer func() {
		for _, cc := range running { // let handlers finish before the ledger closes
			cc.Drain()
			<-cc.Closed()
		}
	}()
	for range c.workers {
		// A small client buffer: JetStream's ack wait runs from delivery, buffered or not.
		cc, err := cons.Consume(a.handle, jetstream.PullMaxMessages(32))
		if err != nil {
			return err
		}
		running = append(running, cc)
	}
	if c.publish == 0 {
		<-ctx.Done()
		return nil
	}
	if err := waitDrained(ctx, cons); err != nil {
		return err
	}
	charged, twice := bill.counts()
	fmt.Fprintf(out, "published %d messages for %d orders; billed %d orders, %d more than once; duplicates acked without billing: %d; dead letters: %d\n",
		c.publish, distinct, charged, twice, a.duplicates.Load(), a.deadLetters.Load())
	return nil
}

// waitDrained polls the consumer until every message was delivered and acknowledged.
func waitDrained(ctx context.Context, cons jetstream.Consumer) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
