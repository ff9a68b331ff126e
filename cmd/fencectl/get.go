package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
)

func (a *app) newGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get SCOPE",
		Short: "Show who holds SCOPE, with its token and time left",
		Long: `Get shows SCOPE's current lease: holder, token, TTL and time left, and how
many acquires wait in line. For a free scope it shows the last token
issued, which the next grant exceeds (for a scope not granted since the
service last took office: the token floor it set, its wall clock in
microseconds).

With -o json it prints the API's GetResponse: {"scope", "lease": LEASE
(only while held), "lastToken", "waiters"}, without the lease ID.`,
		Example: `  fencectl get orders
  fencectl get orders -o json | jq '.lease != null'`,
		Args: exactArgs("SCOPE"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			scope := args[0]
			if err := fence.ValidateScope(scope); err != nil {
				return usage(err)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Get(cmd.Context(), scope)
			if err != nil {
				return err
			}
			// The API's GetResponse: the lease (without its ID, which only
			// its holder knows) only if the scope is held.
			out := &fencev1.GetResponse{Scope: scope, LastToken: st.LastToken, Waiters: uint32(st.Waiters)}
			if st.Lease != nil {
				out.Lease = leaseOut(*st.Lease)
			}
			return a.emit(out, func(w io.Writer) {
				switch l := st.Lease; {
				case l != nil:
					fmt.Fprintf(w, "%s is held by %q with token %d (%s); %s of ttl %s left; %d waiting\n",
						scope, l.Holder, l.Token, l.FencingToken(), dur(l.ExpiresIn), dur(l.TTL), st.Waiters)
				case st.LastToken == 0:
					fmt.Fprintf(w, "%s is free; never granted\n", scope)
				default:
					fmt.Fprintf(w, "%s is free; last token %d\n", scope, st.LastToken)
				}
			})
		}),
	}
	return cmd
}
