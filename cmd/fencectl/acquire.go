package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"time"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/client"
)

// acquireFlags are the flags acquire and exec share.
type acquireFlags struct {
	holder  string
	ttl     time.Duration
	wait    bool
	timeout time.Duration
}

func (f *acquireFlags) register(cmd *cobra.Command, defaultHolder, holderHelp string) {
	fl := cmd.Flags()
	fl.StringVar(&f.holder, "holder", defaultHolder, holderHelp)
	fl.DurationVar(&f.ttl, "ttl", 10*time.Second, "the lease's time to live; the service bounds it (fenced --max-ttl)")
	fl.BoolVar(&f.wait, "wait", false, "if the scope is held, wait in line (first come, first served) until granted, --timeout passes or Ctrl-C")
	fl.DurationVar(&f.timeout, "timeout", 0, "give up acquiring after this long (default: no limit)")
}

// check validates the flags locally, before any call.
func (f *acquireFlags) check(scope string) error {
	if err := fence.ValidateScope(scope); err != nil {
		return usage(err)
	}
	if err := fence.ValidateHolder(f.holder); err != nil {
		return usage(err)
	}
	if err := checkTTL(f.ttl); err != nil {
		return err
	}
	if f.timeout < 0 {
		return usageErrorf("--timeout %v: want a positive duration, or 0 for no limit", f.timeout)
	}
	return nil
}

func (f *acquireFlags) options() []client.AcquireOption {
	opts := []client.AcquireOption{client.WithTTL(f.ttl)}
	if f.holder != "" {
		opts = append(opts, client.WithHolder(f.holder))
	}
	if f.wait {
		opts = append(opts, client.WithWait())
	}
	return opts
}

// context bounds an acquire by --timeout.
func (f *acquireFlags) context(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout > 0 {
		return context.WithTimeout(ctx, f.timeout)
	}
	return context.WithCancel(ctx)
}

// acquireFailed explains an acquire that ended with err. parent is the
// command's context, which Ctrl-C cancels. When --timeout ran out while
// the scope is held, the answer is a *fence.HeldError naming the holder, so
// the exit status is 3 as for an acquire without --wait.
func (f *acquireFlags) acquireFailed(parent context.Context, c *client.Client, scope string, err error) error {
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("acquire %q: interrupted: %w", scope, context.Canceled)
	case f.timeout > 0 && errors.Is(err, context.DeadlineExceeded):
		ctx, cancel := context.WithTimeout(parent, 2*time.Second)
		defer cancel()
		st, gerr := c.Get(ctx, scope)
		if gerr == nil && st.Lease != nil {
			l := st.Lease
			return fmt.Errorf("acquire %q: gave up after --timeout %v: %w", scope, f.timeout,
				&fence.HeldError{Scope: l.Scope, Holder: l.Holder, Token: l.Token, ExpiresIn: l.ExpiresIn})
		}
		return fmt.Errorf("acquire %q: gave up after --timeout %v: %w", scope, f.timeout, context.DeadlineExceeded)
	}
	return err
}

// defaultHolder names a person's lease: $USER@HOSTNAME.
func defaultHolder() string {
	name := os.Getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = "fencectl"
	}
	host, _ := os.Hostname()
	if host != "" {
		name += "@" + host
	}
	if len(name) > fence.MaxHolderLen {
		name = name[:fence.MaxHolderLen]
	}
	return name
}

func (a *app) newAcquireCmd() *cobra.Command {
	var f acquireFlags
	cmd := &cobra.Command{
		Use:   "acquire SCOPE",
		Short: "Take a lease on SCOPE once, without keeping it alive",
		Long: `Acquire takes a lease on SCOPE and prints its fencing token and lease ID.

fencectl exits right after: nothing keeps the lease alive. Renew it within
its TTL with "fencectl renew", or it expires and the next grant of SCOPE
gets a greater token. To hold a lease while a command runs, use
"fencectl exec", which renews for you.

If SCOPE is held, acquire fails with exit status 3 and names the holder,
its token and its time left; with --wait it waits in line instead, until
it is granted, --timeout passes (exit status 3 again) or Ctrl-C (exit
status 1).`,
		Example: `  fencectl acquire orders
  fencectl acquire orders/shard-7 --holder worker-3 --ttl 30s
  fencectl acquire orders --wait --timeout 1m
  fencectl acquire orders -o json | jq -r .lease.leaseId`,
		Args: exactArgs("SCOPE"),
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			scope := args[0]
			if err := f.check(scope); err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := f.context(cmd.Context())
			defer cancel()
			l, err := c.Grant(ctx, scope, f.options()...)
			if err != nil {
				return f.acquireFailed(cmd.Context(), c, scope, err)
			}
			return a.emit(&fencev1.AcquireResponse{Lease: leaseOut(l)}, func(w io.Writer) {
				fmt.Fprintf(w, "granted %s\n", leaseText(l))
			})
		}),
	}
	f.register(cmd, defaultHolder(), "the holder's name, shown to others in get, list and held errors")
	return cmd
}
