package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence/client"
)

const execLong = `Exec acquires a lease on SCOPE, keeps it alive, and runs COMMAND while it
holds it. COMMAND gets fencectl's environment plus:

  FENCE_SCOPE        the scope
  FENCE_TOKEN        the fencing token's text form: signed by default,
                     fence:v3:SCOPE:N:KEY_ID:SIGNATURE, or
                     fence:v1:SCOPE:N from a fenced run with
                     --sign-tokens=false
  FENCE_TOKEN_VALUE  the token's integer N

COMMAND does not get the lease ID: fencectl renews and releases the lease
itself, and whoever knows the ID could release it under COMMAND's feet.

Present the token with every write, so the resource can refuse writes from
a holder that has lost its lease: guard/httpguard reads it from the
Fencing-Token header, whole, as FENCE_TOKEN holds it.

COMMAND runs in its own process group. fencectl passes SIGINT, SIGTERM and
SIGHUP it receives on to that group. When COMMAND exits, fencectl releases
the lease and exits with COMMAND's status (128+N if it was killed by signal
N).

If the lease is lost while COMMAND runs (renewals stop being confirmed
within the TTL, or the service says the lease is no longer current),
fencectl sends SIGTERM to COMMAND's process group, then SIGKILL after
--grace, prints a message naming the lost lease and exits with status 4.
What is left of the group when COMMAND exits is killed too.

Exit status: COMMAND's own; 4 if COMMAND was stopped because the lease was
lost; 126 if COMMAND could not be started, 127 if it was not found; and as
for acquire, 1, 2, 3, 5, 6 or 7 if no lease was acquired (COMMAND did not
run).

fencectl itself never writes to stdout, which belongs to COMMAND; its
messages go to stderr, as text whatever -o says.

Caveats: COMMAND is not in the terminal's foreground process group, so it
cannot read from the terminal. If fencectl is killed with SIGKILL, COMMAND
keeps running with a lease nobody renews; once the lease expires and
another holder writes with a greater token, the resource refuses
COMMAND's writes: that is what the token is for.`

const execExample = `  fencectl exec orders -- ./export-orders.sh --since yesterday
  fencectl exec orders/shard-7 --wait --ttl 30s --grace 5s -- ./worker
  fencectl exec orders -- sh -c 'curl -H "Fencing-Token: $FENCE_TOKEN" https://orders.internal/export'`

// forwarded are the signals exec passes on to its command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

func (a *app) newExecCmd() *cobra.Command {
	var (
		f     acquireFlags
		grace time.Duration
	)
	cmd := &cobra.Command{
		Use:     "exec SCOPE [flags] -- COMMAND [ARG...]",
		Short:   "Run a command while holding a lease that is kept alive",
		Long:    execLong,
		Example: execExample,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case dash < 0:
				return usageErrorf("put -- before the command: fencectl exec SCOPE [flags] -- COMMAND [ARG...]")
			case dash == 0:
				return usageErrorf("missing SCOPE before --")
			case dash > 1:
				return usageErrorf("unexpected argument %q before --: fencectl exec SCOPE [flags] -- COMMAND [ARG...]", args[1])
			case len(args) == dash:
				return usageErrorf("missing COMMAND after --")
			}
			return nil
		},
		RunE: a.run(func(cmd *cobra.Command, args []string) error {
			scope, command := args[0], args[1:]
			if err := f.check(scope); err != nil {
				return err
			}
			if grace < 0 {
				return usageErrorf("--grace %v: want a duration of 0 or more", grace)
			}
			if !canExec {
				return fmt.Errorf("exec: not supported on this operating system")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return a.exec(cmd.Context(), c, &f, scope, command, grace)
		}),
	}
	f.register(cmd, "", `the holder's name (default "fencectl-PID@HOSTNAME")`)
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "after the lease is lost, how long COMMAND has between SIGTERM and SIGKILL")
	return cmd
}

// exec runs command under a lease on scope; see execLong.
func (a *app) exec(ctx context.Context, c *client.Client, f *acquireFlags, scope string, command []string, grace time.Duration) error {
	actx, cancel := f.context(ctx)
	lease, err := c.Acquire(actx, scope, f.options()...)
	cancel()
	if err != nil {
		return f.acquireFailed(ctx, c, scope, err)
	}
	release := func() error {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return lease.Release(rctx)
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	if ctx.Err() != nil { // interrupted while the grant was on its way
		_ = release()
		return fmt.Errorf("exec %q: interrupted: %w", scope, context.Canceled)
	}

	tok := lease.Token()
	child := exec.Command(command[0], command[1:]...)
	child.Env = append(os.Environ(),
		"FENCE_SCOPE="+scope,
		"FENCE_TOKEN="+tok.String(),
		"FENCE_TOKEN_VALUE="+strconv.FormatUint(tok.Value, 10),
	)
	child.Stdin, child.Stdout, child.Stderr = a.stdin, a.stdout, a.stderr
	setProcessGroup(child)
	if err := child.Start(); err != nil {
		if rerr := release(); rerr != nil {
			fmt.Fprintf(a.stderr, "fencectl: warning: %v\n", rerr)
		}
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		return &statusError{code: code, name: "cannot_run", err: err}
	}
	pid := child.Process.Pid
	done := make(chan struct{})
	go func() {
		_ = child.Wait() // the status is in child.ProcessState
		close(done)
	}()

	var (
		lost      error            // why the lease ended while the command ran
		stopped   = "SIGTERM"      // how the command was stopped after the loss
		killAfter <-chan time.Time // --grace, once the lease is lost
	)
	leaseDone := lease.Done()
	for {
		select {
		case s := <-sigs:
			_ = signalGroup(pid, s)
		case <-leaseDone:
			leaseDone = nil
			lost = lease.Err()
			_ = signalGroup(pid, syscall.SIGTERM)
			if grace == 0 {
				stopped = "SIGTERM and SIGKILL"
				_ = signalGroup(pid, syscall.SIGKILL)
			} else {
				t := time.NewTimer(grace)
				defer t.Stop()
				killAfter = t.C
			}
		case <-killAfter:
			killAfter = nil
			stopped = fmt.Sprintf("SIGTERM, then SIGKILL after --grace %v", grace)
			_ = signalGroup(pid, syscall.SIGKILL)
		case <-done:
			if child.ProcessState == nil {
				return fmt.Errorf("exec: wait for %q: no exit status", command[0])
			}
			status := exitStatus(child.ProcessState)
			if lost != nil {
				_ = signalGroup(pid, syscall.SIGKILL) // what is left of the group
				_ = lease.Release(context.Background())
				return &statusError{code: exitLeaseLost, name: "lease_lost", err: fmt.Errorf(
					"exec: stopped %s (pid %d) with %s because its lease was lost: %w",
					command[0], pid, stopped, lost)}
			}
			if err := release(); err != nil {
				fmt.Fprintf(a.stderr, "fencectl: warning: %s exited with status %d, but: %v\n", command[0], status, err)
			}
			if status == 0 {
				return nil
			}
			return &statusError{code: status, name: "command_failed"}
		}
	}
}
