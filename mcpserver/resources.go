package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/toolfence/toolfence/ledger"
	"github.com/toolfence/toolfence/residual"
)

// Resource URIs.
const (
	// PendingURI is the resource listing every open residual of the namespace.
	PendingURI = "toolfence://pending"
	// ResidualURITemplate is the resource template of one residual.
	ResidualURITemplate = "toolfence://residuals/{key}"
	// PromptReconcileTask is the name of the prompt for successor agents.
	PromptReconcileTask = "reconcile_task"

	residualURIPrefix = "toolfence://residuals/"
	// pendingPageTemplate serves the pages after the first of PendingURI.
	pendingPageTemplate = PendingURI + "{?cursor}"
)

func residualURI(key string) string { return residualURIPrefix + key }

func (sp *space) addResources() {
	sp.mcp.AddResource(mcp.NewResource(PendingURI, "pending",
		mcp.WithResourceTitle("Open residuals"),
		mcp.WithResourceDescription("Every pending, unknown and accepted residual of this namespace, with the recovery due. "+
			"Subscribe to be told when any residual changes."),
		mcp.WithMIMEType("application/json"),
	), sp.readPending)
	sp.mcp.AddResourceTemplate(mcp.NewResourceTemplate(pendingPageTemplate, "pending-page",
		mcp.WithTemplateTitle("Open residuals, a later page"),
		mcp.WithTemplateDescription("A later page of toolfence://pending: the next field of a page is its URI."),
		mcp.WithTemplateMIMEType("application/json"),
	), sp.readPending)
	sp.mcp.AddResourceTemplate(mcp.NewResourceTemplate(ResidualURITemplate, "residual",
		mcp.WithTemplateTitle("Residual"),
		mcp.WithTemplateDescription("One residual whole (as inspect_residual shows it); key is tf1_ followed by 64 hex digits."),
		mcp.WithTemplateMIMEType("application/json"),
	), sp.readResidual)
}

// residualResource is the listed resource of one open residual.
func (sp *space) residualResource(key string) server.ServerResource {
	return server.ServerResource{
		// The name is unique (the whole key): resources/list pages by name.
		Resource: mcp.NewResource(residualURI(key), "residual "+key,
			mcp.WithResourceDescription("An open residual of this namespace."),
			mcp.WithMIMEType("application/json")),
		Handler: sp.readResidual,
	}
}

func jsonContents(uri string, v any) ([]mcp.ResourceContents, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "application/json", Text: string(b)}}, nil
}

func (sp *space) readPending(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	uri := req.Params.URI
	var cursor string
	if rest, ok := strings.CutPrefix(uri, PendingURI); ok && rest != "" {
		q, err := url.ParseQuery(strings.TrimPrefix(rest, "?"))
		if err != nil || !strings.HasPrefix(rest, "?") {
			return nil, fmt.Errorf("toolfence: %q: want %s or %s?cursor=NEXT_CURSOR", uri, PendingURI, PendingURI)
		}
		cursor = q.Get("cursor")
	}
	page, err := sp.ic.Ledger().List(ctx, ledger.ListParams{Namespace: sp.ns, States: openStates, Limit: sp.srv.opts.PageSize, Cursor: cursor})
	if err != nil {
		if errors.Is(err, ledger.ErrInvalidParams) {
			return nil, fmt.Errorf("toolfence: %q: %w", uri, err)
		}
		return nil, fmt.Errorf("toolfence: listing open residuals: %s", sp.ledgerFailed(PendingURI, err))
	}
	now := sp.now()
	out := PendingPage{ListResult: ListResult{Residuals: make([]ResidualSummary, 0, len(page.Residuals)), NextCursor: page.NextCursor}}
	for _, r := range page.Residuals {
		out.Residuals = append(out.Residuals, summarize(r, now))
	}
	if page.NextCursor != "" {
		out.Next = PendingURI + "?" + url.Values{"cursor": {page.NextCursor}}.Encode()
	}
	return jsonContents(uri, out)
}

func (sp *space) readResidual(ctx context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	uri := req.Params.URI
	key, ok := strings.CutPrefix(uri, residualURIPrefix)
	if !ok {
		return nil, fmt.Errorf("toolfence: %q is not a residual URI", uri)
	}
	if err := residual.ValidKey(key); err != nil {
		return nil, fmt.Errorf("toolfence: %w", err)
	}
	r, err := sp.get(ctx, key)
	if errors.Is(err, residual.ErrNotFound) {
		return nil, fmt.Errorf("toolfence: no residual with key %s in this namespace: %w", key, server.ErrResourceNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("toolfence: %s", sp.ledgerFailed(uri, err))
	}
	return jsonContents(uri, view(r, sp.now()))
}

func (sp *space) addPrompt() {
	sp.mcp.AddPrompt(mcp.NewPrompt(PromptReconcileTask,
		mcp.WithPromptTitle("Take over a task"),
		mcp.WithPromptDescription("Tells a successor agent how to read and settle what its predecessor left in flight for a task."),
		mcp.WithArgument("task", mcp.RequiredArgument(), mcp.ArgumentDescription("The task (agent run / job / conversation id) to take over.")),
	), sp.reconcileTaskPrompt)
}

func (sp *space) reconcileTaskPrompt(ctx context.Context, req mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	task := req.Params.Arguments["task"]
	if task == "" {
		return nil, errors.New("toolfence: the task argument is required")
	}
	page, err := sp.ic.Ledger().List(ctx, ledger.ListParams{Namespace: sp.ns, States: openStates, Task: task, Limit: ledger.MaxListLimit})
	if err != nil {
		return nil, fmt.Errorf("toolfence: listing open residuals of task %q: %s", task, sp.ledgerFailed(PromptReconcileTask, err))
	}
	now := sp.now()
	var b strings.Builder
	fmt.Fprintf(&b, "You are taking over task %q from a predecessor agent that may have crashed in the middle of side-effecting calls.\n", task)
	b.WriteString(`Rules: never perform a side-effecting call whose previous outcome is unknown; never treat a queued (202) answer as done.

1. Call list_pending with task set to this task (and follow next_cursor) to see every residual left open.
2. pending: a call is in flight under a live lease. Do not touch it; wait for it to commit or for its lease to expire, then look again.
3. unknown: the call may have reached upstream. Call reconcile with its key first: registered probes ask upstream. If it stays open,
   check upstream yourself (look up the key, which was sent as Idempotency-Key, or the target) and call resolve_residual with
   as=succeeded (and the result) if the effect happened, as=failed if it did not, and a note saying what you checked.
4. accepted: upstream queued the call. Poll its handle; when upstream finishes, resolve_residual (or reconcile).
5. Then continue the task. Guard every side-effecting call with begin_call → (perform only on proceed) → commit_call
   with the key, token and lease_secret of that proceed result (renew_lease takes them too). Keep lease_secret to
   yourself: it is what makes you the holder. A replay decision returns the recorded result: use it instead of calling again.
   You cannot commit your predecessor's attempts (their lease_secret is gone with them): settle them as in 3 and 4.
`)
	if len(page.Residuals) == 0 {
		fmt.Fprintf(&b, "\nRight now task %q has no open residuals.\n", task)
	} else {
		fmt.Fprintf(&b, "\nRight now task %q has %d open residual(s):\n", task, len(page.Residuals))
		for _, r := range page.Residuals {
			s := summarize(r, now)
			fmt.Fprintf(&b, "- %s: %s on %q, attempt %d by %s — %s\n", s.State, s.Operation, s.Target, s.Attempt, s.Holder, s.Key)
		}
		if page.NextCursor != "" {
			b.WriteString("- … and more: use list_pending with next_cursor.\n")
		}
	}
	return mcp.NewGetPromptResult("Take over task "+task,
		[]mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent(b.String()))}), nil
}
