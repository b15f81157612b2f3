// Package policy is the proxy's policy language: it parses and validates policies and pins from the bytes it is given, decides per tool (protect or bypass), and checks a listed catalog against both (Check), with no I/O of its own.
//
// It imports interceptor (only for its one sentinel of unusable settings, ErrInvalidOptions), jsonptr (targets) and residual (digests), and the YAML v3 package.
package policy
