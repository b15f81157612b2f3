package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolfence/toolfence/consumer"
)

// toMessage converts a JetStream delivery into a consumer.Message. The ID is the producer's
// Nats-Msg-Id when it set one, else "stream:sequence", which stays the same across
// redeliveries of the stored message.
func toMessage(msg jetstream.Msg) consumer.Message {
	m := consumer.Message{Subject: msg.Subject(), Body: msg.Data(), Header: msg.Headers()}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		m.ID = id
	} else if meta, err := msg.Metadata(); err == nil {
		m.ID = fmt.Sprintf("%s:%d", meta.Stream, meta.Sequence.Stream)
	}
	return m
}

// adapter connects a guarded handler to JetStream: it turns each delivery into a Message
// and the guard's verdict into the acknowledgement.
//
//   - Ack → DoubleAck (the server confirmed the ack; a lost ack only means a redelivery,
//     which the guard acknowledges as a duplicate);
//   - Retry → NakWithDelay(RetryAfter): nothing happened, deliver it again later;
//   - DeadLetter → NakWithDelay(hold): never acked as done; the guard already reported it,
//     and the redelivery after the hold is acknowledged once a reconciler resolved the
//     residual (or runs again if it was resolved as failed).
type adapter struct {
	guard *consumer.Guarded
	// hold is the redelivery delay of dead-lettered messages.
	hold time.Duration
	log  *slog.Logger
	// Counts of what the guard decided.
	ran, duplicates, retries, deadLetters atomic.Int64
}

// handle is the jetstream.MessageHandler.
func (a *adapter) handle(msg jetstream.Msg) {
	a.settle(msg, a.process(msg))
}

// process runs one delivery through the guard. The handler's context does not end with
// the consumer's: a handler stopped half-way would leave an unknown outcome.
func (a *adapter) process(msg jetstream.Msg) consumer.Outcome {
	o := a.guard.Handle(context.Background(), toMessage(msg))
	switch {
	case o.Verdict == consumer.Retry:
		a.retries.Add(1)
	case o.Verdict == consumer.DeadLetter:
		a.deadLetters.Add(1)
	case o.Duplicate:
		a.duplicates.Add(1)
	case o.Ran:
		a.ran.Add(1)
	}
	return o
}

// settle acknowledges a delivery according to its verdict.
func (a *adapter) settle(msg jetstream.Msg, o consumer.Outcome) {
	var err error
	switch o.Verdict {
	case consumer.Ack:
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = msg.DoubleAck(ctx)
		cancel()
	case consumer.Retry:
		err = msg.NakWithDelay(o.RetryAfter)
	default:
		err = msg.NakWithDelay(a.hold)
	}
	if err != nil {
		a.log.Warn("consumer: acknowledgement failed; the message will be redelivered", "subject", msg.Subject(), "verdict", o.Verdict, "err", err)
	}
}
