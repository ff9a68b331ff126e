// Command fencectl is the command line of the fence lease service: acquire,
// renew, release, get and list leases, run a command under a lease that is
// kept alive while it runs, and show and change a cluster's members. Run
// "fencectl --help" for the commands, the output formats and the exit
// statuses.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
