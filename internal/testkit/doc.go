// Package testkit is what the tests of every package share: the -short switch for tests that
// need a service or a long run, and the PostgreSQL test server with a schema per test.
// It imports pgx and the standard library only; only _test.go files import it.
package testkit
