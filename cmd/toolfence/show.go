package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/toolfence/toolfence/ledger"
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

Example:
  toolfence show tf1_3f1c…e9 --store ./.toolfence
  toolfence show tf1_3f1c…e9 --json | jq '.attempts[-1]'`,
		Args: args("KEY"),
		RunE: func(cmd *cobra.Command, argv []string) error { return a.show(cmd.Context(), argv[0], asJSON) },
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the residual as JSON")
	return cmd
}

func (a *app) show(ctx context.Context, key string, asJSON bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	l, err := a.open(ctx, true)
	if err != nil {
		return err
	}
	defer l.Close()
	r, err := a.get(ctx, l, key)
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
func (a *app) get(ctx context.Context, l ledger.Ledger, key string) (*residual.Residual, error) {
	r, err := l.Get(ctx, ledger.GetParams{Namespace: a.namespace, Key: key})
	if errors.Is(err, residual.ErrNotFound) {
		return nil, fmt.Errorf("no residual %s in namespace %s", key, a.namespace)
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	return r, nil
}
