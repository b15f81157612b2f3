package payments

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Backend performs and looks up charges. Implementations must be safe for concurrent use.
type Backend interface {
	// Charge charges amountCents for orderID and returns the new charge's id. Every call is
	// a new charge: the backend does not deduplicate (that is the proxy's job). An error
	// means the charge may or may not have happened.
	Charge(ctx context.Context, orderID string, amountCents int64) (string, error)
	// Find returns the id of the first charge of orderID, or found false when there is none.
	Find(ctx context.Context, orderID string) (id string, found bool, err error)
	// List returns every charge, oldest first.
	List(ctx context.Context) ([]Charge, error)
}

// Charge is one charge in a backend.
type Charge struct {
	ID          string    `json:"charge_id"`
	OrderID     string    `json:"order_id"`
	AmountCents int64     `json:"amount_cents"`
	At          time.Time `json:"at"`
}

// ChargeIn is the input of the charge tool.
type ChargeIn struct {
	OrderID     string `json:"order_id" jsonschema:"the order to charge"`
	AmountCents int64  `json:"amount_cents" jsonschema:"amount in cents, at least 1"`
}

// ChargeOut is the structured result of the charge tool.
type ChargeOut struct {
	ChargeID    string `json:"charge_id"`
	OrderID     string `json:"order_id"`
	AmountCents int64  `json:"amount_cents"`
}

// FindIn is the input of the find_charge tool.
type FindIn struct {
	OrderID string `json:"order_id" jsonschema:"the order to look up"`
}

// FindOut is the structured result of the find_charge tool: Found and, when found, the id
// of the order's first charge.
type FindOut struct {
	Found    bool   `json:"found"`
	ChargeID string `json:"charge_id,omitempty"`
}

// ListOut is the structured result of the list_charges tool.
type ListOut struct {
	Charges []Charge `json:"charges"`
}

// NewServer returns the payments MCP server over b: charge (mutating: every call is a new
// charge), find_charge and list_charges (both annotated readOnlyHint: true).
func NewServer(b Backend) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "payments", Version: "1.0.0"}, nil)
	no := false
	mcp.AddTool(s, &mcp.Tool{
		Name:        "charge",
		Description: "Charge an order's card. Every call is a new charge: do not repeat it.",
		Annotations: &mcp.ToolAnnotations{Title: "Charge an order", DestructiveHint: &no},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in ChargeIn) (*mcp.CallToolResult, ChargeOut, error) {
		if in.OrderID == "" || in.AmountCents < 1 {
			return nil, ChargeOut{}, errors.New("invalid charge: want an order_id and amount_cents ≥ 1; nothing was charged")
		}
		id, err := b.Charge(ctx, in.OrderID, in.AmountCents)
		if err != nil {
			return nil, ChargeOut{}, err
		}
		return nil, ChargeOut{ChargeID: id, OrderID: in.OrderID, AmountCents: in.AmountCents}, nil
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "find_charge",
		Description: "Look up whether an order has been charged.",
		Annotations: &mcp.ToolAnnotations{Title: "Find an order's charge", ReadOnlyHint: true},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in FindIn) (*mcp.CallToolResult, FindOut, error) {
		id, found, err := b.Find(ctx, in.OrderID)
		if err != nil {
			return nil, FindOut{}, err
		}
		return nil, FindOut{Found: found, ChargeID: id}, nil
	})
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_charges",
		Description: "List every charge.",
		Annotations: &mcp.ToolAnnotations{Title: "List charges", ReadOnlyHint: true},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListOut, error) {
		cs, err := b.List(ctx)
		if err != nil {
			return nil, ListOut{}, err
		}
		return nil, ListOut{Charges: cs}, nil
	})
	return s
}

// Serve runs the payments server over b on stdin and stdout until the client goes away.
func Serve(ctx context.Context, b Backend) error {
	return NewServer(b).Run(ctx, &mcp.StdioTransport{})
}

// FileLedger is a Backend that appends each charge as a JSON line to a file and fsyncs it
// before it answers. Charge ids are "ch_<n>", n counting the file's lines (read once, at
// the first charge), so processes that use the file one after another never reuse an id.
// It is safe for concurrent use within one process; two processes must not charge into one
// file at once.
type FileLedger struct {
	Path string

	mu     sync.Mutex
	loaded bool
	n      int // charges in the file
}

// Charge appends and fsyncs the charge. It returns an error naming the file when it
// cannot be written (the charge may then be in the file, unsynced).
func (f *FileLedger) Charge(_ context.Context, orderID string, amountCents int64) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.loaded {
		cs, err := ReadLedger(f.Path)
		if err != nil {
			return "", err
		}
		f.n, f.loaded = len(cs), true
	}
	c := Charge{ID: fmt.Sprintf("ch_%d", f.n+1), OrderID: orderID, AmountCents: amountCents, At: time.Now().UTC()}
	line, _ := json.Marshal(c)
	file, err := os.OpenFile(f.Path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return "", fmt.Errorf("payments: ledger %s: %w", f.Path, err)
	}
	defer file.Close()
	if _, err := file.Write(append(line, '\n')); err != nil {
		return "", fmt.Errorf("payments: ledger %s: %w", f.Path, err)
	}
	if err := file.Sync(); err != nil {
		return "", fmt.Errorf("payments: ledger %s: %w", f.Path, err)
	}
	f.n++
	return c.ID, nil
}

// Find returns the first charge of orderID in the file.
func (f *FileLedger) Find(_ context.Context, orderID string) (string, bool, error) {
	cs, err := ReadLedger(f.Path)
	if err != nil {
		return "", false, err
	}
	for _, c := range cs {
		if c.OrderID == orderID {
			return c.ID, true, nil
		}
	}
	return "", false, nil
}

// List returns every charge in the file.
func (f *FileLedger) List(context.Context) ([]Charge, error) { return ReadLedger(f.Path) }

// ReadLedger reads the charges of a ledger file; a missing file holds none. It returns an
// error naming the file and the line when a line is not a charge.
func ReadLedger(path string) ([]Charge, error) {
	file, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("payments: ledger %s: %w", path, err)
	}
	defer file.Close()
	var cs []Charge
	sc := bufio.NewScanner(file)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var c Charge
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			return nil, fmt.Errorf("payments: ledger %s line %d: %w", path, n, err)
		}
		cs = append(cs, c)
	}
	return cs, sc.Err()
}
