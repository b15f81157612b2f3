package consumer

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolfence/toolfence/interceptor"
)

// Defaults of Options.
const (
	DefaultOperation  = "consume"
	DefaultRetryAfter = time.Second
)

// Message is one delivery of a message, as the broker adapter hands it over.
type Message struct {
	// ID identifies the message across redeliveries (a producer's message id, or the
	// broker's stream sequence). It is the key unless Options.Key says otherwise.
	ID string
	// Subject is the topic, subject or queue the message came from.
	Subject string
	// Header holds the message's headers, if the broker has any.
	Header map[string][]string
	// Body is the payload. Its digest is the message's fingerprint: a redelivery with the
	// same key and another body is refused as a payload mismatch.
	Body []byte
}

// Handler performs the message's effect. It must respect ctx (which ends before the lease
// does). Return an error wrapping interceptor.ErrNoEffect (interceptor.NoEffect) when the
// handler is certain it did nothing, so the message may be retried; any other error, and a
// panic, leave the outcome unknown.
type Handler func(ctx context.Context, m Message) error

// Verdict tells the adapter what to do with a delivery.
type Verdict int

// Verdicts.
const (
	// Ack: the message's effect is recorded (by this delivery or an earlier one).
	// Acknowledge it.
	Ack Verdict = iota + 1
	// Retry: nothing took effect in this delivery (the handler refused with no effect,
	// another delivery of the same message is in flight, or the ledger could not record a
	// reservation). Negative-acknowledge it for redelivery after Outcome.RetryAfter.
	Retry
	// DeadLetter: the outcome is unknown or still open upstream, or the message cannot be
	// guarded. Do not acknowledge it as done; it was reported to Options.OnDeadLetter.
	// Redeliveries keep landing here until the residual is reconciled, after which they
	// are acknowledged (resolved as succeeded) or run again (resolved as failed).
	DeadLetter
)

// String returns "ack", "retry" or "dead-letter".
func (v Verdict) String() string {
	switch v {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case DeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Outcome says what Handle did with one delivery.
type Outcome struct {
	Verdict Verdict
	// Key is the residual key of the message ("" when no key could be derived).
	Key string
	// Ran is true when the handler ran in this delivery.
	Ran bool
	// Duplicate is true when an earlier delivery's recorded effect stands and the handler
	// did not run.
	Duplicate bool
	// Attempt is the attempt number this delivery ran as, or the blocking attempt.
	Attempt int
	// RetryAfter is when to redeliver (Retry only).
	RetryAfter time.Duration
	// Err is the handler's error or the *interceptor.Violation that blocked the delivery.
	Err error
}

// ErrNoKey is reported (Verdict DeadLetter) for a message from which no key could be
// derived; its handler never runs unguarded.
var ErrNoKey = errors.New("consumer: message has no key")

// invalidOptions is Guard's error for unusable options: "consumer: invalid options: " and
// the detail, wrapping interceptor.ErrInvalidOptions.
func invalidOptions(format string, args ...any) error {
	return interceptor.InvalidOptions("consumer: invalid options", format, args...)
}

// Options configure Guard.
type Options struct {
	// Group is the consumer group (durable consumer name, subscription): the task of every
	// residual, so two groups each process a message once. Required.
	Group string
	// Operation names the residuals' operation (register a probe for it to reconcile
	// automatically). Defaults to "consume".
	Operation string
	// Key returns the key of a message: a business id from the payload ("order:42") when
	// the producer may publish the same intent twice under different message ids. An error
	// or an empty key dead-letters the message with ErrNoKey. Defaults to Message.ID.
	Key func(m Message) (string, error)
	// OnDeadLetter is called for every DeadLetter verdict, before Handle returns. Defaults
	// to nothing (the adapter still gets the verdict).
	OnDeadLetter func(ctx context.Context, m Message, o Outcome)
	// RetryAfter is the redelivery delay of Retry verdicts when the ledger gives none.
	// Defaults to 1s.
	RetryAfter time.Duration
}

// Guarded is a guarded handler. It is safe for concurrent use by any number of consumers.
type Guarded struct {
	ic   *interceptor.Interceptor
	h    Handler
	opts Options
}

// Guard returns h guarded by ic: each message key's effect happens at most once per group,
// duplicates are acknowledged without running h, and an unknown outcome is never
// acknowledged as done. It returns an error wrapping interceptor.ErrInvalidOptions when ic or h is nil
// or Group is empty.
func Guard(ic *interceptor.Interceptor, h Handler, opts Options) (*Guarded, error) {
	switch {
	case ic == nil:
		return nil, invalidOptions("nil interceptor")
	case h == nil:
		return nil, invalidOptions("nil handler")
	case opts.Group == "":
		return nil, invalidOptions("Group is required (it scopes the keys)")
	case opts.RetryAfter < 0:
		return nil, invalidOptions("RetryAfter %v is negative", opts.RetryAfter)
	}
	opts.Operation = cmp.Or(opts.Operation, DefaultOperation)
	opts.RetryAfter = cmp.Or(opts.RetryAfter, DefaultRetryAfter)
	if opts.Key == nil {
		opts.Key = func(m Message) (string, error) { return m.ID, nil }
	}
	return &Guarded{ic: ic, h: h, opts: opts}, nil
}

// Handle runs one delivery through the guard and returns the verdict for the broker.
func (g *Guarded) Handle(ctx context.Context, m Message) Outcome {
	key, err := g.opts.Key(m)
	if err == nil && key == "" {
		err = errors.New("empty key")
	}
	if err != nil {
		return g.deadLetter(ctx, m, Outcome{Err: fmt.Errorf("%w: %s (subject %q): %w", ErrNoKey, m.ID, m.Subject, err)})
	}
	ran := false
	res, err := g.ic.Do(interceptor.WithTask(ctx, g.opts.Group), interceptor.Call{
		Operation: g.opts.Operation, Target: key, Args: fingerprint(m.Body),
	}, func(ctx context.Context, d interceptor.Dispatch) (interceptor.Response, error) {
		ran = true
		return interceptor.Response{}, g.h(ctx, m)
	})
	o := Outcome{Ran: ran, Err: err}
	if res != nil {
		o.Key, o.Attempt = res.Key, res.Attempt
	}
	switch {
	case err == nil:
		o.Verdict, o.Duplicate = Ack, res.Replayed
		return o
	case errors.Is(err, interceptor.ErrCallFailed), errors.Is(err, interceptor.ErrNotDispatched):
		o.Verdict, o.RetryAfter = Retry, g.opts.RetryAfter
		return o
	}
	v, ok := errors.AsType[*interceptor.Violation](err)
	if !ok { // a malformed call: nothing ran, and a retry would not help
		return g.deadLetter(ctx, m, o)
	}
	o.Key, o.Attempt = v.Key, v.Attempt
	switch v.Kind {
	case interceptor.InProgress:
		o.Verdict, o.RetryAfter = Retry, g.opts.RetryAfter
		if v.RetryAfter > 0 && v.RetryAfter < o.RetryAfter {
			o.RetryAfter = v.RetryAfter
		}
		return o
	case interceptor.MarginTooSmall:
		o.Verdict, o.RetryAfter = Retry, g.opts.RetryAfter
		return o
	default: // UnknownOutcome, AwaitingUpstream, PayloadMismatch, LeaseLost
		return g.deadLetter(ctx, m, o)
	}
}

func (g *Guarded) deadLetter(ctx context.Context, m Message, o Outcome) Outcome {
	o.Verdict = DeadLetter
	if g.opts.OnDeadLetter != nil {
		g.opts.OnDeadLetter(ctx, m, o)
	}
	return o
}

// fingerprint returns the interceptor arguments of a message: the digest of its body,
// canonical for JSON (re-serialised JSON is the same message), of the raw bytes otherwise.
func fingerprint(body []byte) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"body": interceptor.BodyDigest(body, true)})
	return b
}
