package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	lctools "github.com/tmc/langchaingo/tools"

	"github.com/toolfence/toolfence/interceptor"
	"github.com/toolfence/toolfence/jsonptr"
	"github.com/toolfence/toolfence/residual"
)

// configErr is the error of a guarded tool whose options are unusable (no target
// declared, a malformed pointer, a nil interceptor). Such a tool runs nothing and returns
// this error from every Call, in every mode: it is a programming error, not the model's.
// Its text is "tools: invalid guard configuration: " and the detail; it wraps
// interceptor.ErrInvalidOptions.
func configErr(format string, args ...any) error {
	return interceptor.InvalidOptions("tools: invalid guard configuration", format, args...)
}

// Option configures Guard and New. The zero set of options is usable only with New on an
// input type that tags its target fields.
type Option func(*options)

type options struct {
	pointers   []string
	targetFunc func(input string) (string, error)
	opaque     bool
	errors     bool
	upstream   string
	operation  string
	// check validates the input before anything is reserved (typed tools).
	check func(input []byte) error
}

// WithTarget declares the target as the values at these RFC 6901 JSON pointers into the
// tool's JSON input ("/invoice_id", "/customer/email"). One pointer gives its value (a
// string as is, anything else as canonical JSON); several are joined as the JSON array of
// their values, so different inputs never join into the same target. Repeated calls add
// pointers.
func WithTarget(pointers ...string) Option {
	return func(o *options) { o.pointers = append(o.pointers, pointers...) }
}

// WithTargetFunc derives the target from the raw input with fn, for inputs pointers cannot
// address. It replaces WithTarget. An error from fn refuses the call before anything is
// reserved.
func WithTargetFunc(fn func(input string) (string, error)) Option {
	return func(o *options) { o.targetFunc = fn }
}

// WithOpaqueInput lets a tool whose input is not JSON be guarded: such an input is used whole
// as the target (inputs over 200 bytes by their SHA-256), so only a byte-identical input is
// the same call. JSON inputs still use the declared pointers or function when there are any.
func WithOpaqueInput() Option {
	return func(o *options) { o.opaque = true }
}

// WithErrors makes the guarded tool return Go errors (the *interceptor.Violation, errors
// wrapping interceptor.ErrNoTask, jsonptr.ErrNoTarget, ErrInvalidInput or interceptor.ErrCallFailed)
// instead of plain-language observations. Note that langchaingo's executor ends the run on a
// tool error.
func WithErrors() Option {
	return func(o *options) { o.errors = true }
}

// WithUpstreamName names what the tool calls ("the payment API") in observations. Defaults
// to "the upstream of <tool name>".
func WithUpstreamName(name string) Option {
	return func(o *options) { o.upstream = name }
}

// WithOperation sets the operation name keys are derived from (for example a versioned
// "charge_invoice@v2"). Defaults to the tool's name.
func WithOperation(name string) Option {
	return func(o *options) { o.operation = name }
}

// withCheck adds an input check that runs before anything is reserved.
func withCheck(check func(input []byte) error) Option {
	return func(o *options) { o.check = check }
}

// Guarded is a langchaingo tool whose calls run through an interceptor. It is safe for
// concurrent use when the wrapped tool is.
type Guarded struct {
	inner lctools.Tool
	ic    *interceptor.Interceptor
	opts  options
	ptrs  []jsonptr.Pointer
	// cfgErr is returned by every Call when the configuration is unusable.
	cfgErr error
}

var _ lctools.Tool = (*Guarded)(nil)

// Guard wraps t so that each call runs through ic's ordering barrier, in the task carried by
// the call's context (interceptor.WithTask), on the target the options declare. The wrapped
// tool receives a context carrying the dispatch (see interceptor.DispatchFrom and
// Transport). Guard never fails: a configuration error (no target declared, a malformed
// pointer, nil t or ic) is reported by Err and returned by every Call.
func Guard(t lctools.Tool, ic *interceptor.Interceptor, opts ...Option) *Guarded {
	g := &Guarded{inner: t, ic: ic}
	for _, o := range opts {
		o(&g.opts)
	}
	g.cfgErr = g.configure()
	return g
}

func (g *Guarded) configure() error {
	if g.inner == nil {
		return configErr("nil tool")
	}
	if g.ic == nil {
		return configErr("tool %q: nil interceptor", g.inner.Name())
	}
	if len(g.opts.pointers) == 0 && g.opts.targetFunc == nil && !g.opts.opaque {
		return configErr("tool %q declares no target: use WithTarget, WithTargetFunc or WithOpaqueInput", g.inner.Name())
	}
	for _, text := range g.opts.pointers {
		p, err := jsonptr.Parse(text)
		if err != nil {
			return configErr("tool %q: %w", g.inner.Name(), err)
		}
		g.ptrs = append(g.ptrs, p)
	}
	return nil
}

// Err returns the configuration error every Call would return, or nil.
func (g *Guarded) Err() error { return g.cfgErr }

// Name returns the wrapped tool's name.
func (g *Guarded) Name() string {
	if g.inner == nil {
		return ""
	}
	return g.inner.Name()
}

// Description returns the wrapped tool's description.
func (g *Guarded) Description() string {
	if g.inner == nil {
		return ""
	}
	return g.inner.Description()
}

func (g *Guarded) operation() string {
	if g.opts.operation != "" {
		return g.opts.operation
	}
	return g.inner.Name()
}

// Call runs the wrapped tool through the interceptor. It returns the tool's output when the
// call executed and succeeded, and "[replayed] already done, outcome recorded at <time>: <cached output>" when
// the call had already succeeded (nothing is dispatched). Every refusal or ambiguity is an
// observation in plain language with a nil error, or with WithErrors the Go error (see the
// package doc). A configuration error (see Err) is always returned as an error.
func (g *Guarded) Call(ctx context.Context, input string) (string, error) {
	if g.cfgErr != nil {
		return "", g.cfgErr
	}
	if _, ok := interceptor.TaskFrom(ctx); !ok {
		return g.refuse(interceptor.ErrNoTask, fmt.Sprintf(
			"toolfence: no task in the context, so %s was not run: the program must wrap the agent's context with interceptor.WithTask", g.Name()))
	}
	call, err := g.prepare(input)
	if err != nil {
		detail := err.Error()
		var ie *InputError
		if errors.As(err, &ie) {
			detail = ie.Detail
		}
		return g.refuse(err, fmt.Sprintf("invalid input for %s, nothing was sent: %s", g.Name(), detail))
	}
	res, err := g.ic.Do(ctx, call, func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		ctx = WithDispatch(ctx, d)
		out, err := g.inner.Call(ctx, input)
		return responseOf([]byte(out), err, stateFrom(ctx))
	})
	return g.answer(res, err)
}

// prepare checks the input and derives the call: target, operation and JSON args.
func (g *Guarded) prepare(input string) (interceptor.Call, error) {
	call := interceptor.Call{Operation: g.operation()}
	doc, jerr := jsonptr.Decode([]byte(input))
	if jerr != nil {
		if !g.opts.opaque {
			return call, inputErr(ErrInvalidInput, g.Name(), "the input must be JSON: %v", jerr)
		}
		call.Target = opaqueTarget(input)
		args, err := json.Marshal(input)
		if err != nil || !utf8.ValidString(input) {
			sum := sha256.Sum256([]byte(input))
			args, _ = json.Marshal(map[string]string{"sha256": hex.EncodeToString(sum[:])})
		}
		call.Args = args
		return call, nil
	}
	if g.opts.check != nil {
		if err := g.opts.check([]byte(input)); err != nil {
			return call, err
		}
	}
	call.Args = json.RawMessage(input)
	switch {
	case g.opts.targetFunc != nil:
		t, err := g.opts.targetFunc(input)
		if err != nil {
			return call, inputErr(jsonptr.ErrNoTarget, g.Name(), "%v", err)
		}
		if t == "" {
			return call, inputErr(jsonptr.ErrNoTarget, g.Name(), "the target function returned an empty target")
		}
		call.Target = t
	case len(g.ptrs) > 0:
		t, err := jsonptr.Extract(g.Name(), g.ptrs, doc)
		if err != nil {
			return call, asInputErr(err)
		}
		call.Target = t
	default: // opaque only
		call.Target = opaqueTarget(input)
	}
	return call, nil
}

func opaqueTarget(input string) string {
	if len(input) <= 200 && utf8.ValidString(input) && input != "" {
		return input
	}
	sum := sha256.Sum256([]byte(input))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// responseOf builds the interceptor's Response from the wrapped tool's answer and what
// Transport observed: a tool error after answers that all proved no effect is marked as no
// effect; an observed outcome is stated outright.
func responseOf(out []byte, err error, st *dispatchState) (interceptor.Response, error) {
	resp := interceptor.Response{Body: out}
	ex, ok := st.observed()
	if !ok {
		return resp, err
	}
	resp.Status, resp.Handle, resp.Outcome = ex.Status, ex.Handle, ex.Outcome
	switch {
	case err == nil:
	case ex.Outcome == residual.Failed && !errors.Is(err, interceptor.ErrNoEffect):
		err = interceptor.NoEffect(err)
	case ex.Outcome != residual.Failed && errors.Is(err, interceptor.ErrNoEffect):
		// What Transport saw (a 5xx, a timeout, a 2xx) may have had an effect: the tool's
		// claim that nothing happened cannot override it.
		err = errors.New(err.Error())
	}
	return resp, err
}

// refuse answers a call refused before anything was reserved.
func (g *Guarded) refuse(err error, observation string) (string, error) {
	if g.opts.errors {
		return "", err
	}
	return observation, nil
}

// answer turns what Do returned into the tool's answer.
func (g *Guarded) answer(res *interceptor.Result, err error) (string, error) {
	if err == nil {
		if res.Replayed {
			return replayObservation(res), nil
		}
		return string(res.Output), nil
	}
	if g.opts.errors {
		return "", err
	}
	return g.observe(res, err), nil
}
