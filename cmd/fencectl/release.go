package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

func (a *app) newReleaseCmd() *cobra.Command {
	var lease string
	cmd := &cobra.Command{
		Use:   "release SCOPE --lease ID",
		Short: "Free a lease so the next acquire need not wait for it to expire",
		Long: `Release frees SCOPE if ID is its current lease. The scope's token counter
stays: the next grant gets a greater token.

A lease ID that is not the current lease of SCOPE fails with exit status 1
and changes nothing.

With -o json it prints the API's ReleaseResponse: {"scope", "token"}, the
token of the lease released (left out if a retried release cannot tell).`,
		Example: `  fencectl release orders --lease 9f86d081884c7d659a2feaa0c55ad015`,
		Args:    exactArgs("SCOPE"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			scope := args[0]
			id, err := scopeAndLease(scope, lease)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			tok, err := c.Release(cmd.Context(), scope, id)
			if err != nil {
				return err
			}
			return a.emit(&fencev1.ReleaseResponse{Scope: scope, Token: tok}, func(w io.Writer) {
				if tok == 0 {
					fmt.Fprintf(w, "released %s lease %s\n", scope, id)
					return
				}
				fmt.Fprintf(w, "released %s token %d (%s) lease %s\n", scope, tok, fence.Token{Scope: scope, Value: tok}, id)
			})
		}),
	}
	cmd.Flags().StringVar(&lease, "lease", "", "the lease ID that acquire printed (32 hexadecimal digits)")
	_ = cmd.MarkFlagRequired("lease")
	return cmd
}
