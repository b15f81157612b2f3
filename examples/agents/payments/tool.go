package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/ledger/badger"
	"github.com/toolfence/toolfence/residual"
	"github.com/toolfence/toolfence/tools"
)

// ChargeInput is what the model sends; the invoice is the target: one charge per invoice
// per task.
type ChargeInput struct {
	InvoiceID   string `json:"invoice_id" toolfence:"target" jsonschema:"description=The invoice to charge"`
	AmountCents int    `json:"amount_cents" jsonschema:"description=Amount in cents,minimum=1"`
	Currency    string `json:"currency" jsonschema:"enum=EUR,enum=USD"`
}

// leaseTTL is short so the successor does not wait long for the dead agent's lease.
const leaseTTL = time.Second

// client sends every request through toolfence's transport: the key goes out as
// Idempotency-Key and the answer is classified.
var client = &http.Client{Transport: &tools.Transport{}, Timeout: 30 * time.Second}

// chargeTool is the typed charge_invoice tool against the payment API at api.
func chargeTool(api string) (*tools.Typed[ChargeInput, Charge], error) {
	return tools.New("charge_invoice", "Charge an invoice through the payment API, once.",
		func(ctx context.Context, in ChargeInput) (Charge, error) {
			body, _ := json.Marshal(in)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/charges", bytes.NewReader(body))
			if err != nil {
				return Charge{}, err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return Charge{}, err
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusCreated {
				return Charge{}, fmt.Errorf("payment API answered %s: %s", resp.Status, raw)
			}
			var c Charge
			return c, json.Unmarshal(raw, &c)
		}, tools.WithUpstreamName("the payment API"))
}

// probe asks the payment API whether it holds a charge made with the attempt's key.
func probe(api string) interceptor.Probe {
	return func(ctx context.Context, r *residual.Residual) (interceptor.ProbeResult, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/charges?idempotency_key="+url.QueryEscape(r.Key), nil)
		if err != nil {
			return interceptor.ProbeResult{}, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return interceptor.ProbeResult{}, err
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case http.StatusOK:
			var c Charge
			if err := json.Unmarshal(raw, &c); err != nil {
				return interceptor.ProbeResult{}, err
			}
			out, _ := json.Marshal(c) // the shape the tool itself returns
			return interceptor.ProbeResult{Outcome: residual.Succeeded, Result: out,
				Evidence: fmt.Sprintf("the payment API holds charge %s for this Idempotency-Key", c.ID)}, nil
		case http.StatusNotFound:
			return interceptor.ProbeResult{Outcome: residual.Failed, Evidence: "the payment API has no charge for this Idempotency-Key"}, nil
		}
		return interceptor.ProbeResult{Outcome: residual.Unknown, Evidence: "lookup answered " + resp.Status}, nil
	}
}

// open opens the ledger in dir and an interceptor for holder with the probe registered.
func open(dir, holder, api string) (*badger.Ledger, *interceptor.Interceptor, error) {
	led, err := badger.Open(dir, badger.Options{})
	if err != nil {
		return nil, nil, err
	}
	ic, err := interceptor.New(led, interceptor.Options{Holder: holder, LeaseTTL: leaseTTL})
	if err == nil {
		err = ic.Register("charge_invoice", interceptor.Operation{Probe: probe(api)})
	}
	if err != nil {
		_ = led.Close()
		return nil, nil, err
	}
	return led, ic, nil
}
