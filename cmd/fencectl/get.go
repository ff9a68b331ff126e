package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
)

// scopeJSON is get's -o json output. A held scope adds its lease's fields
// (without the lease ID, which only its holder knows) and the waiters.
type scopeJSON struct {
	Scope     string `json:"scope"`
	Held      bool   `json:"held"`
	LastToken uint64 `json:"last_token"`
	*leaseJSON
	Waiters *int `json:"waiters,omitempty"`
}

func (a *app) newGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get SCOPE",
		Short: "Show who holds SCOPE, with its token and time left",
		Long: `Get shows SCOPE's current lease: holder, token, TTL and time left, and how
many acquires wait in line. For a free scope it shows the last token
issued, which the next grant exceeds (for a scope not granted since the
service last took office: the token floor it set, its wall clock in
microseconds).`,
		Example: `  fencectl get orders
  fencectl get orders -o json | jq .held`,
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
			out := scopeJSON{Scope: scope, Held: st.Lease != nil, LastToken: st.LastToken}
			if st.Lease != nil {
				out.leaseJSON = leaseOut(*st.Lease)
				out.Waiters = &st.Waiters
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
