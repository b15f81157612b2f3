package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

KEY is a key as printed by ls: "tf1_" followed by 64 hex digits. --json prints the record
as JSON (the same fields as ls --json, indented).

With --server URL (or $TOOLFENCE_SERVER) show asks a running ` + "`toolfence serve --http`" + `
instead of opening the store, in the namespace of your bearer token (--token,
--token-file or $TOOLFENCE_TOKEN).

Example:
  toolfence show tf1_3f1c…e9 --store ./.toolfence
  toolfence show tf1_3f1c…e9 --json | jq '.attempts[-1]'
  toolfence show tf1_3f1c…e9 --server http://127.0.0.1:7777`,
		Args: args("KEY"),
		RunE: func(cmd *cobra.Command, argv []string) error { return a.show(cmd, argv[0], asJSON) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the residual as JSON")
	a.serverFlags(cmd)
	return cmd
}

func (a *app) show(cmd *cobra.Command, key string, asJSON bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	l, err := a.records(cmd)
	if err != nil {
		return err
	}
	defer l.Close()
	r, err := get(cmd.Context(), l, key)
	if err != nil {
		return err
	}
	if asJSON {
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", b)
		return err
	}
	return writeResidual(a.stdout, r, timeNow())
}

// checkKey returns a usage error for a key toolfence did not derive.
func checkKey(key string) error {
	if err := residual.ValidKey(key); err != nil {
		return usagef("invalid key %q: want %q followed by 64 lowercase hex digits, as `toolfence ls` prints them", key, residual.KeyPrefix)
	}
	return nil
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
