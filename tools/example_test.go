package tools_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/tools"
)

// chargeTool stands for a langchaingo tool you already have.
type chargeTool struct{ charges int }

func (c *chargeTool) Name() string { return "charge_invoice" }
func (c *chargeTool) Description() string {
	return `Charge an invoice. Input: {"invoice": "INV-1", "cents": 100}`
}
func (c *chargeTool) Call(ctx context.Context, input string) (string, error) {
	c.charges++
	return `{"charge":"ch_1"}`, nil
}

// The README snippet: guard an existing langchaingo tool in one line. TestReadmeSnippet keeps
// tools/README.md's copy of this body identical.
func ExampleGuard() {
	dir, _ := os.MkdirTemp("", "toolfence") // a fresh ledger; use a fixed directory in production
	defer os.RemoveAll(dir)
	led, err := badger.Open(dir, badger.Options{}) // the embedded ledger
	if err != nil {
		log.Fatal(err)
	}
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Options{})
	if err != nil {
		log.Fatal(err)
	}

	charge := &chargeTool{}                                          // any langchaingo tools.Tool
	guarded := tools.Guard(charge, ic, tools.WithTarget("/invoice")) // give this to your agent
	ctx := interceptor.WithTask(context.Background(), "run-42")      // the run a successor inherits

	out, _ := guarded.Call(ctx, `{"invoice":"INV-42","cents":12500}`)
	again, _ := guarded.Call(ctx, `{"invoice":"INV-42","cents":12500}`) // a retry: replayed, not charged
	fmt.Println(out, strings.HasPrefix(again, "[replayed] already done"), charge.charges)
	// Output: {"charge":"ch_1"} true 1
}

// A typed tool: the schema comes from the input struct, the target from its tag.
func ExampleNew() {
	type Charge struct {
		Invoice string `json:"invoice" toolfence:"target"`
		Cents   int    `json:"cents"`
	}
	charge, err := tools.New("charge_invoice", "Charge an invoice.",
		func(ctx context.Context, in Charge) (string, error) {
			return fmt.Sprintf("charged %s %d cents", in.Invoice, in.Cents), nil
		})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(charge.Schema()))

	dir, _ := os.MkdirTemp("", "toolfence-example")
	defer os.RemoveAll(dir)
	led, err := badger.Open(dir, badger.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer led.Close()
	ic, err := interceptor.New(led, interceptor.Options{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := interceptor.WithTask(context.Background(), "run-42")
	out, _ := charge.Tool(ic).Call(ctx, `{"invoice":"INV-42","cents":"12500"}`)
	fmt.Println(out)
	out, _ = charge.Tool(ic).Call(ctx, `{"invoice":"INV-42","cents":12500}`)
	fmt.Println(out)
	// Output:
	// {"properties":{"invoice":{"type":"string"},"cents":{"type":"integer"}},"additionalProperties":false,"type":"object","required":["invoice","cents"]}
	// invalid input for charge_invoice, nothing was sent: field "/cents" must be an integer, got a string
	// charged INV-42 12500 cents
}
