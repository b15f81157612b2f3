// Package faultproxy is a TCP proxy for fault-injection tests: latency, bandwidth caps, connection resets, silent timeouts, full partitions and their heal.
// It imports only the standard library; evals/jepsen uses it between the clients and PostgreSQL.
package faultproxy
