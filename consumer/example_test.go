package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/toolfence/toolfence/consumer"
	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
)

// Guard a handler of at-least-once deliveries: the redelivery is acknowledged without
// sending the email twice; an ambiguous failure is dead-lettered, not acknowledged.
func ExampleGuard() {
	dir, err := os.MkdirTemp("", "consumer-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := badger.Open(dir, badger.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	ic, err := interceptor.New(store, interceptor.Options{Holder: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	sent := 0
	g, err := consumer.Guard(ic, func(ctx context.Context, m consumer.Message) error {
		if m.ID == "m-2" {
			return errors.New("smtp: connection reset after DATA") // did it send? nobody knows
		}
		sent++
		return nil
	}, consumer.Options{
		Group: "mailer",
		OnDeadLetter: func(ctx context.Context, m consumer.Message, o consumer.Outcome) {
			fmt.Println("dead letter:", m.ID)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"m-1", "m-1", "m-2"} {
		o := g.Handle(context.Background(), consumer.Message{ID: id, Body: []byte(`{"to":"bob"}`)})
		fmt.Printf("%s: %s ran=%t duplicate=%t\n", id, o.Verdict, o.Ran, o.Duplicate)
	}
	fmt.Println("sent:", sent)
	// Output:
	// m-1: ack ran=true duplicate=false
	// m-1: ack ran=false duplicate=true
	// dead letter: m-2
	// m-2: dead-letter ran=true duplicate=false
	// sent: 1
}
