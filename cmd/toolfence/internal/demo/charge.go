package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
	"github.com/toolfence/toolfence/tools"
)

// The guarded call of the story.
const (
	// Operation is the name of the charge tool, and the operation of its keys.
	Operation = "charge"
	// Invoice is the invoice the story charges.
	Invoice = "INV-42"
	// Target is the thing the charge mutates.
	Target = "invoice:" + Invoice
	// ChargeArgs is what the agents' model sends to the charge tool: 42.00 EUR for INV-42.
	ChargeArgs = `{"invoice":"` + Invoice + `","amount_cents":4200,"currency":"EUR"}`
	// Upstream names the payment API in the observations the agents read.
	Upstream = "the payment API"
)

// chargeTool is the plain langchaingo tool, before toolfence guards it: it POSTs its JSON
// input to the API's /charges and returns the API's answer.
type chargeTool struct {
	client *http.Client
	api    string
}

func (chargeTool) Name() string { return Operation }

func (chargeTool) Description() string {
	return `Charges an invoice through the payment API. Input: {"invoice": "INV-…", "amount_cents": N, "currency": "EUR"}.`
}

// Call POSTs input to api/charges and returns the body of a 201. Any other status is an
// error carrying the body; the client's transport (tools.Transport) has already recorded
// the exchange for the guard, which classifies it.
func (c chargeTool) Call(ctx context.Context, input string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.api+"/charges", bytes.NewReader([]byte(input)))
	if err != nil {
		return "", interceptor.NoEffect(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("reading the API's answer: %w", err)
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("the payment API answered %s: %s", resp.Status, body)
	}
	return string(body), nil
}

// NewChargeTool returns the unguarded charge tool: a langchaingo tool named "charge" that
// POSTs its JSON input to apiURL/charges through client. Give it a client whose transport
// is a tools.Transport, so a guarded call forwards its key as Idempotency-Key and its
// answer is classified.
func NewChargeTool(client *http.Client, apiURL string) lctools.Tool {
	return chargeTool{client: client, api: apiURL}
}

// GuardedCharge returns the charge tool as the agents use it: guarded by ic (one line:
// tools.Guard), on the target "invoice:<invoice>" of its input, with plain-language
// observations naming the payment API. Its HTTP client sends through a tools.Transport over
// base (http.DefaultTransport when nil).
func GuardedCharge(ic *interceptor.Interceptor, base http.RoundTripper, apiURL string) *tools.Guarded {
	client := &http.Client{Transport: &tools.Transport{Base: base}}
	return tools.Guard(NewChargeTool(client, apiURL), ic,
		tools.WithTargetFunc(chargeTarget), tools.WithUpstreamName(Upstream))
}

// chargeTarget is "invoice:" + the input's invoice.
func chargeTarget(input string) (string, error) {
	var in struct {
		Invoice string `json:"invoice"`
	}
	if err := json.Unmarshal([]byte(input), &in); err != nil {
		return "", err
	}
	if in.Invoice == "" {
		return "", errors.New(`the input names no "invoice"`)
	}
	return "invoice:" + in.Invoice, nil
}

// ChargeProbe returns the probe of the charge operation: it asks apiURL for the charge made
// under the residual's key (sent as Idempotency-Key). 200 settles the residual as
// succeeded with the charge as its result; 404 as failed (the API records a charge before
// anything else, so no record means no charge); anything else leaves it open with an error.
func ChargeProbe(client *http.Client, apiURL string) interceptor.Probe {
	return func(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
		path := "/charges?idempotency_key=" + url.QueryEscape(r.Key)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+path, nil)
		if err != nil {
			return interceptor.ProbeResult{}, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return interceptor.ProbeResult{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return interceptor.ProbeResult{}, fmt.Errorf("reading the API's answer: %w", err)
		}
		switch resp.StatusCode {
		case http.StatusOK:
			var c Charge
			if err := json.Unmarshal(body, &c); err != nil || c.ID == "" {
				return interceptor.ProbeResult{}, fmt.Errorf("GET %s: 200 with an unreadable charge: %q", path, body)
			}
			return interceptor.ProbeResult{
				Outcome: residual.Succeeded, Result: body,
				Evidence: fmt.Sprintf("GET /charges?idempotency_key=…: 200, charge %s of %s", c.ID, c.Invoice),
			}, nil
		case http.StatusNotFound:
			return interceptor.ProbeResult{
				Outcome:  residual.Failed,
				Evidence: "GET /charges?idempotency_key=…: 404, the API never made a charge with this key",
			}, nil
		default:
			return interceptor.ProbeResult{Outcome: residual.Unknown}, fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, body)
		}
	}
}
