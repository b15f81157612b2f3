// Package crashtest re-executes the test binary as a child in a named role and SIGKILLs or SIGSTOPs it at a point the child announces.
// It imports only the standard library and x/sys; the crash tests of every package use it.
package crashtest
