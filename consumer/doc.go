// Package consumer guards handlers of at-least-once message deliveries, so each message's
// effect happens once and an unknown outcome is dead-lettered instead of acknowledged.
//
// It imports interceptor only; broker adapters (NATS, Kafka) import it.
package consumer
