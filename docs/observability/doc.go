// Package observability holds no code: its tests check the Prometheus rules and the
// Grafana dashboard beside them (see docs/observability.md). It imports nothing of ours.
package observability
