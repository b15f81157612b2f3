package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/residual"
)

func newShowCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show KEY",
		Short: "Show one residual: attempts, evidence, resolutions and what to do next",
		Long: `Show the whole residual of KEY: the call it guards (task, operation, target), its
effective state, the cached result, every attempt with its holder, fencing token, lease and
outcome, the evidence fenced-out holders left, and the audit of resolutions. For an open
residual it ends with the recovery that is due.

KEY is a key as ls prints it: the whole key ("tf1_" and 64 hex digits) or any unique prefix
of it of at least 4 hex digits, with or without "tf1_" (as git takes commit hashes); a
prefix two keys share is refused with the keys it matches. Through --server a prefix is
looked up among open residuals only.

--json prints the record as JSON (the same fields as ls --json, indented), exactly as
stored; the human output escapes control characters in text that agents supplied.

With --server URL (or $TOOLFENCE_SERVER) show asks a running ` + "`toolfence serve --http`" + `
instead of opening the store, in the namespace of your bearer token (--token,
--token-file or $TOOLFENCE_TOKEN).

Example:
  toolfence show tf1_3f1c09e2 --store ./.toolfence
  toolfence show 3f1c09e2 --json | jq '.attempts[-1]'
  toolfence show tf1_3f1c09e2 --server http://127.0.0.1:7777`,
		Args: args("KEY"),
		RunE: func(cmd *cobra.Command, argv []string) error { return a.show(cmd, argv[0], asJSON) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the residual as JSON")
	a.serverFlags(cmd)
	a.postgresFlags(cmd)
	return cmd
}

func (a *app) show(cmd *cobra.Command, arg string, asJSON bool) error {
	if err := checkKey(arg); err != nil {
		return err
	}
	l, err := a.records(cmd)
	if err != nil {
		return err
	}
	defer l.Close()
	key, err := findKey(cmd.Context(), l, arg)
	if err != nil {
		return err
	}
	r, err := get(cmd.Context(), l, key)
	if err != nil {
		return err
	}
	if asJSON {
		return writeResidualJSON(a.stdout, r)
	}
	return writeResidual(a.stdout, r, timeNow())
}

// minKeyPrefix is the fewest hex digits a key prefix may have.
const minKeyPrefix = 4

// maxListedMatches bounds the keys an ambiguous prefix's error lists.
const maxListedMatches = 10

// keyDigits returns the hex digits of arg, a whole key or a key prefix with or without
// "tf1_"; ok is false when arg is neither.
func keyDigits(arg string) (digits string, ok bool) {
	digits = strings.TrimPrefix(arg, residual.KeyPrefix)
	if len(digits) < minKeyPrefix || len(digits) > residual.KeyLen-len(residual.KeyPrefix) {
		return "", false
	}
	for _, c := range digits {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return digits, true
}

// checkKey returns a usage error for an argument that is neither a key toolfence derived
// nor a prefix of one.
func checkKey(arg string) error {
	if _, ok := keyDigits(arg); !ok {
		return usagef("invalid key %q: want %q followed by 64 lowercase hex digits, as `toolfence ls --wide` prints them, "+
			"or a unique prefix of at least %d hex digits, as `toolfence ls` prints them", arg, residual.KeyPrefix, minKeyPrefix)
	}
	return nil
}

// findKey returns the whole key arg names (arg passed checkKey): arg itself when it is a
// whole key, else the one key of l that starts with it. No key, or more than one, is an
// error that says so and lists the matches.
func findKey(ctx context.Context, l records, arg string) (string, error) {
	digits, _ := keyDigits(arg)
	prefix := residual.KeyPrefix + digits
	if len(prefix) == residual.KeyLen {
		return prefix, nil
	}
	var matches []string
	for cursor := ""; ; {
		keys, next, err := l.keys(ctx, cursor)
		if err != nil {
			return "", fmt.Errorf("looking up key prefix %s: %w", prefix, err)
		}
		for _, k := range keys {
			if strings.HasPrefix(k, prefix) {
				matches = append(matches, k)
			}
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return "", fmt.Errorf("no residual whose key starts with %s in %s", prefix, l.where())
	}
	sort.Strings(matches)
	listed := matches[:min(len(matches), maxListedMatches)]
	more := ""
	if len(matches) > len(listed) {
		more = fmt.Sprintf("\n  … and %d more", len(matches)-len(listed))
	}
	return "", usagef("key prefix %s is ambiguous: %d residuals in %s match; give more digits:\n  %s%s",
		prefix, len(matches), l.where(), strings.Join(listed, "\n  "), more)
}

// get reads one residual, turning "not found" into a message that names the namespace.
func get(ctx context.Context, l records, key string) (*residual.Residual, error) {
	r, err := l.get(ctx, key)
	if errors.Is(err, residual.ErrNotFound) {
		return nil, fmt.Errorf("no residual %s in %s", key, l.where())
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	return r, nil
}
