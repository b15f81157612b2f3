package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

type chargeInput struct {
	InvoiceID   string `json:"invoice_id" toolfence:"target" jsonschema:"description=The invoice to charge"`
	AmountCents int    `json:"amount_cents" jsonschema:"minimum=1"`
	Currency    string `json:"currency" jsonschema:"enum=EUR,enum=USD"`
	Note        string `json:"note,omitempty"`
}

type chargeOutput struct {
	ChargeID string `json:"charge_id"`
}

type address struct {
	Email string `json:"email" toolfence:"target"`
	Name  string `json:"name,omitempty"`
}

type attachment struct {
	Filename string `json:"filename"`
	Bytes    int    `json:"bytes"`
}

type emailInput struct {
	To          address           `json:"to"`
	Kind        string            `json:"kind" toolfence:"target"`
	Body        string            `json:"body"`
	Tags        []string          `json:"tags,omitempty"`
	Attachments []attachment      `json:"attachments,omitempty"`
	Meta        map[string]string `json:"meta,omitempty"`
	SendAt      *time.Time        `json:"send_at,omitempty"`
	internal    int
}

func noop[In any](context.Context, In) (string, error) { return "ok", nil }

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, got, 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./tools -run Golden -update to create it")
	require.Equal(t, string(want), string(got), "golden file %s differs; rerun with -update if the change is intended", path)
}

func TestTypedDefinitionGolden(t *testing.T) {
	t.Parallel()
	charge, err := New("charge_invoice", "Charge an invoice once.", noop[chargeInput])
	require.NoError(t, err)
	email, err := New("send_email", "Send one email.", noop[emailInput])
	require.NoError(t, err)
	for name, def := range map[string]any{"charge_invoice": charge.Definition(), "send_email": email.Definition()} {
		raw, err := json.MarshalIndent(def, "", "  ")
		require.NoError(t, err)
		golden(t, name, append(raw, '\n'))
	}
	require.Equal(t, []string{"/invoice_id"}, charge.pointers)
	require.Equal(t, []string{"/to/email", "/kind"}, email.pointers)
}

func TestTypedValidationNamesTheField(t *testing.T) {
	t.Parallel()
	charge, err := New("charge_invoice", "", noop[chargeInput])
	require.NoError(t, err)
	email, err := New("send_email", "", noop[emailInput])
	require.NoError(t, err)
	ok := `{"invoice_id":"INV-1","amount_cents":100,"currency":"EUR"}`
	require.NoError(t, charge.Check([]byte(ok)))
	require.NoError(t, email.Check([]byte(`{"to":{"email":"b@x"},"kind":"welcome","body":"hi","tags":["a"],
		"attachments":[{"filename":"a.pdf","bytes":3}],"meta":{"k":"v"},"send_at":"2025-01-02T03:04:05Z"}`)))
	cases := []struct {
		typed interface{ Check([]byte) error }
		input string
		want  string
	}{
		{charge, `{"amount_cents":100,"currency":"EUR"}`, `field "/invoice_id" is required`},
		{charge, `{"invoice_id":"INV-1","amount_cents":"100","currency":"EUR"}`, `field "/amount_cents" must be an integer, got a string`},
		{charge, `{"invoice_id":"INV-1","amount_cents":1.5,"currency":"EUR"}`, `field "/amount_cents" must be an integer, got a number`},
		{charge, `{"invoice_id":"INV-1","amount_cents":100,"currency":"GBP"}`, `field "/currency" must be one of "EUR", "USD"`},
		{charge, `{"invoice_id":"INV-1","amount_cents":100,"currency":"EUR","amount":1}`, `field "/amount" is not a known field (known: amount_cents, currency, invoice_id, note)`},
		{charge, `["INV-1"]`, `the input must be an object, got an array`},
		{charge, `{"invoice_id":null,"amount_cents":100,"currency":"EUR"}`, `field "/invoice_id" must be a string, got null`},
		{email, `{"to":{"email":"b@x","cc":"c@x"},"kind":"w","body":""}`, `field "/to/cc" is not a known field`},
		{email, `{"to":{},"kind":"w","body":""}`, `field "/to/email" is required`},
		{email, `{"to":{"email":"b@x"},"kind":"w","body":"","tags":["a",2]}`, `field "/tags/1" must be a string, got a number`},
		{email, `{"to":{"email":"b@x"},"kind":"w","body":"","attachments":[{"filename":"a"}]}`, `field "/attachments/0/bytes" is required`},
		{email, `{"to":{"email":"b@x"},"kind":"w","body":"","meta":{"k":1}}`, `field "/meta/k" must be a string, got a number`},
		{email, `{"to":{"email":"b@x"},"kind":"w","body":"","send_at":"tomorrow"}`, `field "/send_at" must be an RFC 3339 date-time, got "tomorrow"`},
		{charge, `not json`, `the input must be a JSON object`},
	}
	for _, c := range cases {
		err := c.typed.Check([]byte(c.input))
		require.ErrorIs(t, err, ErrInvalidInput, c.input)
		require.ErrorContains(t, err, c.want, c.input)
	}
}

type recursive struct {
	ID   string     `json:"id" toolfence:"target"`
	Next *recursive `json:"next,omitempty"`
}

type withChan struct {
	ID string        `json:"id" toolfence:"target"`
	C  chan struct{} `json:"c"`
}

type untargeted struct {
	ID string `json:"id"`
}

type badTag struct {
	ID string `json:"id" toolfence:"key"`
}

type embedded struct {
	address
	Extra string `json:"extra" toolfence:"target"`
}

func TestNewRefusesBadTools(t *testing.T) {
	t.Parallel()
	_, err := New("charge invoice", "", noop[chargeInput])
	require.ErrorIs(t, err, ErrInvalidTool)
	_, err = New[chargeInput, string]("c", "", nil)
	require.ErrorIs(t, err, ErrInvalidTool)
	_, err = New("c", "", noop[string])
	require.ErrorContains(t, err, "is not a struct")
	_, err = New("c", "", noop[recursive])
	require.ErrorContains(t, err, "is recursive")
	_, err = New("c", "", noop[withChan])
	require.ErrorContains(t, err, "cannot be encoded as JSON")
	_, err = New("c", "", noop[untargeted])
	require.ErrorContains(t, err, "no field tagged")
	_, err = New("c", "", noop[badTag])
	require.ErrorContains(t, err, `unknown toolfence tag "key"`)

	typed, err := New("c", "", noop[untargeted], WithTarget("/id"))
	require.NoError(t, err, "an option may declare the target")
	require.Empty(t, typed.pointers)
	e, err := New("c", "", noop[*embedded])
	require.NoError(t, err)
	require.Equal(t, []string{"/email", "/extra"}, e.pointers, "embedded fields are inlined as encoding/json does")
}

func TestTypedSchemaIsSelfContained(t *testing.T) {
	t.Parallel()
	email, err := New("send_email", "", noop[emailInput])
	require.NoError(t, err)
	s := email.Schema()
	require.False(t, bytes.Contains(s, []byte(`"$ref"`)), "no references: %s", s)
	require.False(t, bytes.Contains(s, []byte(`"$schema"`)))
	require.False(t, bytes.Contains(s, []byte(`internal`)))
	s[0] = 'X'
	require.Equal(t, byte('{'), email.Schema()[0], "Schema returns a copy")
}
