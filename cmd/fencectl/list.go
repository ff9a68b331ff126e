package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

func (a *app) newListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [PREFIX]",
		Short: "List held scopes, optionally those starting with PREFIX",
		Long: `List shows every held scope whose name starts with PREFIX (all of them
without one), in scope order, with holder, token, TTL and time left. Free
scopes are not listed; "fencectl get" shows one.

With -o json it prints the API's ListResponse, every page in one:
{"leases": [LEASE, ...]} without lease IDs, and {} when none is held.`,
		Example: `  fencectl list
  fencectl list orders/
  fencectl list -o json | jq -r '.leases[]?.scope'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf("unexpected argument %q: list takes at most one PREFIX", args[1])
			}
			return nil
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			if err := fence.ValidatePrefix(prefix); err != nil {
				return usage(err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			leases, err := c.List(cmd.Context(), prefix)
			if err != nil {
				return err
			}
			out := &fencev1.ListResponse{}
			for _, l := range leases {
				out.Leases = append(out.Leases, leaseOut(l))
			}
			return a.emit(out, func(w io.Writer) {
				if len(leases) == 0 {
					if prefix == "" {
						fmt.Fprintln(w, "no scope is held")
					} else {
						fmt.Fprintf(w, "no scope starting with %q is held\n", prefix)
					}
					return
				}
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SCOPE\tTOKEN\tHOLDER\tTTL\tLEFT")
				for _, l := range leases {
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", l.Scope, l.Token, l.Holder, dur(l.TTL), dur(l.ExpiresIn))
				}
				tw.Flush()
			})
		}),
	}
	return cmd
}
