package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/residual"
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
	//lint:ignore U1000 an unexported field: the test checks the schema leaves it out
	internal int
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
		{charge, `{"invoice_id":"INV-1","amount_cents":1.0,"currency":"EUR"}`, `field "/amount_cents" cannot hold number 1.0: it takes a whole number within the range of Go's int`},
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

// refund has constraints invopop reflects into the schema; validation enforces each of them.
type refund struct {
	Invoice string `json:"invoice" toolfence:"target" jsonschema:"pattern=^INV-[0-9]+$"`
	Cents   int    `json:"cents" jsonschema:"minimum=1,maximum=100000"`
	Email   string `json:"email" jsonschema:"format=email"`
	Reason  string `json:"reason,omitempty" jsonschema:"maxLength=20"`
	Rate    int    `json:"rate,omitempty" jsonschema:"exclusiveMinimum=0,multipleOf=5"`
}

// Every constraint the schema shows the model is checked before anything is reserved: the
// error names the field by its JSON pointer, the tool never runs and the ledger holds
// nothing for the call.
func TestTypedValidationEnforcesSchemaConstraints(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	typed, err := New("refund", "Refund an invoice.", func(context.Context, refund) (string, error) {
		runs.Add(1)
		return "refunded", nil
	})
	require.NoError(t, err)
	require.NoError(t, typed.Check([]byte(`{"invoice":"INV-1","cents":500,"email":"bob@example.com"}`)))
	cases := []struct{ input, want, field string }{
		{`{"invoice":"INV-1","cents":-500,"email":"bob@example.com"}`, `field "/cents" must be at least 1, got -500`, "/cents"},
		{`{"invoice":"INV-1","cents":100001,"email":"bob@example.com"}`, `field "/cents" must be at most 100000, got 100001`, "/cents"},
		{`{"invoice":"42","cents":5,"email":"bob@example.com"}`, `field "/invoice" must match the pattern ^INV-[0-9]+$, got "42"`, "/invoice"},
		{`{"invoice":"INV-1","cents":5,"email":"bob"}`, `field "/email" must be an email address, got "bob"`, "/email"},
		{`{"invoice":"INV-1","cents":5,"email":"b@x.io","reason":"because it was charged twice"}`, `field "/reason" must be at most 20 characters long, got 28`, "/reason"},
		{`{"invoice":"INV-1","cents":5,"email":"b@x.io","rate":7}`, `field "/rate" must be a multiple of 5, got 7`, "/rate"},
		{`{"invoice":"INV-1","cents":5,"email":"b@x.io","rate":0}`, `field "/rate" must be greater than 0, got 0`, "/rate"},
	}
	b := setup(t)
	guarded := typed.Tool(b.ic)
	for _, c := range cases {
		err := typed.Check([]byte(c.input))
		require.ErrorIs(t, err, ErrInvalidInput, c.input)
		require.ErrorContains(t, err, c.want, c.input)
		var ie *InputError
		require.ErrorAs(t, err, &ie)
		require.Equal(t, []string{c.field}, ie.Fields, c.input)

		out, err := guarded.Call(b.ctx, c.input)
		require.NoError(t, err)
		require.Equal(t, "invalid input for refund, nothing was sent: "+c.want, out)
	}
	require.Zero(t, runs.Load(), "the tool never ran")
	_, err = b.ic.Ledger().Get(b.ctx, ledgerGet(b, b.ic.Key("run-42", "refund", "INV-1")))
	require.ErrorIs(t, err, residual.ErrNotFound, "nothing was reserved")

	// Several bad fields are all named, in pointer order.
	err = typed.Check([]byte(`{"invoice":"x","cents":0,"email":"bob"}`))
	require.ErrorContains(t, err, `field "/cents" must be at least 1, got 0; field "/email" must be an email address, got "bob"; field "/invoice" must match`)
}

// Agents that see only a tool's name and description (langchaingo's) learn the input's shape
// from Description: each field, its type, whether it is required and every constraint.
func TestTypedDescriptionCarriesTheInputShape(t *testing.T) {
	t.Parallel()
	typed, err := New("refund", "Refund an invoice.", noop[refund])
	require.NoError(t, err)
	b := setup(t)
	for _, desc := range []string{typed.Description(), typed.Tool(b.ic).Description()} {
		require.True(t, strings.HasPrefix(desc, "Refund an invoice. Input: a JSON object {"), desc)
		for _, want := range []string{
			`"invoice" string, required, matching ^INV-[0-9]+$`,
			`"cents" integer, required, minimum 1, maximum 100000`,
			`"email" string, required, format email`,
			`"reason" string, at most 20 characters`,
			`"rate" integer, greater than 0, multiple of 5`,
			`no other fields}`,
		} {
			require.Contains(t, desc, want)
		}
		require.NotContains(t, desc, "\n", "one line, as agents list their tools")
	}
	require.Equal(t, "Refund an invoice.", typed.Definition().Function.Description, "the definition carries the schema itself")

	email, err := New("send_email", "", noop[emailInput])
	require.NoError(t, err)
	for _, want := range []string{
		`"to" object {"email" string, required; "name" string; no other fields}, required`,
		`"attachments" array of object {"bytes" integer, required; "filename" string, required; no other fields}`,
		`"meta" object with values of string`, `"send_at" string, format date-time`, `"tags" array of string`,
	} {
		require.Contains(t, email.Description(), want)
	}
	require.True(t, strings.HasPrefix(email.Description(), "Input: "), "no prose: the shape alone")
}

// Keywords without words of their own are still shown, so no constraint is left out.
func TestDescribeInputShowsEveryKeyword(t *testing.T) {
	t.Parallel()
	schema, err := jsonptr.Decode([]byte(`{"type":"object","properties":{
		"a":{"type":["string","null"],"minLength":2,"not":{"const":"xx"}},
		"b":{"anyOf":[{"type":"integer"},{"type":"string","format":"uuid"}],"description":"id"},
		"c":{"type":"array","items":{"type":"number"},"minItems":1,"uniqueItems":true,"default":[1]}},
		"required":["b"]}`))
	require.NoError(t, err)
	require.Equal(t, `Input: a JSON object {"a" string or null, at least 2 characters, not={"const":"xx"}; `+
		`"b" one of: integer | string, format uuid, required (id); `+
		`"c" array of number, at least 1 items, no repeated items, default [1]}`, describeInput(schema))
}
