package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

// scopeAndLease validates a scope and a --lease flag locally.
func scopeAndLease(scope, lease string) (fence.LeaseID, error) {
	if err := fence.ValidateScope(scope); err != nil {
		return fence.LeaseID{}, usage(err)
	}
	id, err := fence.ParseLeaseID(lease)
	if err != nil {
		return fence.LeaseID{}, usage(err)
	}
	return id, nil
}

func (a *app) newRenewCmd() *cobra.Command {
	var lease string
	cmd := &cobra.Command{
		Use:   "renew SCOPE --lease ID",
		Short: "Extend a lease by its TTL; the token stays the same",
		Long: `Renew extends the lease ID on SCOPE by its TTL, counted from now. The
token does not change: only a new grant changes it.

If the lease is no longer current (it expired, was released or was
superseded), renew fails with exit status 1: stop acting on it, and acquire
a new lease to continue.`,
		Example: `  fencectl renew orders --lease 9f86d081884c7d659a2feaa0c55ad015
  # Keep a lease taken with acquire alive from a shell loop:
  while fencectl renew orders --lease "$id" >/dev/null; do sleep 3; done`,
		Args: exactArgs("SCOPE"),
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
			l, err := c.Renew(cmd.Context(), scope, id)
			if err != nil {
				return err
			}
			if l.ID.IsZero() {
				l.ID = id
			}
			return a.emit(&fencev1.RenewResponse{Lease: leaseOut(l)}, func(w io.Writer) {
				fmt.Fprintf(w, "renewed %s, %s left\n", leaseText(l), dur(l.ExpiresIn))
			})
		}),
	}
	cmd.Flags().StringVar(&lease, "lease", "", "the lease ID that acquire printed (32 hexadecimal digits)")
	_ = cmd.MarkFlagRequired("lease")
	return cmd
}
