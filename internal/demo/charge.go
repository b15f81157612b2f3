package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/residual"
)

// The guarded call of the story.
const (
	// Operation is the tool name of the charge.
	Operation = "charge"
	// Invoice is the invoice the story charges.
	Invoice = "INV-42"
	// Target is the thing the charge mutates.
	Target = "invoice:" + Invoice
)

// ChargeCall returns the guarded call that charges invoice INV-42 with 42.00 EUR.
func ChargeCall() interceptor.Call {
	return interceptor.Call{
		Operation: Operation,
		Target:    Target,
		Args:      json.RawMessage(`{"invoice":"` + Invoice + `","amount_cents":4200,"currency":"EUR"}`),
	}
}

// ChargeTool returns the tool that POSTs the call's args to apiURL/charges, forwarding the
// key as Idempotency-Key and the fencing token as X-Fencing-Token. A transport error is
// returned as is (an unknown outcome); an HTTP answer is returned with its status for the
// classifier.
func ChargeTool(client *http.Client, apiURL string) interceptor.ToolFunc {
	return func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/charges", bytes.NewReader(d.Args))
		if err != nil {
			return interceptor.Response{}, interceptor.NoEffect(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", d.Key)
		req.Header.Set("X-Fencing-Token", strconv.FormatUint(d.Token, 10))
		resp, err := client.Do(req)
		if err != nil {
			return interceptor.Response{}, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return interceptor.Response{Status: resp.StatusCode}, fmt.Errorf("reading the API's answer: %w", err)
		}
		return interceptor.Response{Body: body, Status: resp.StatusCode}, nil
	}
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
