// Command fencecheck runs fenced, a guarded resource and a set of workers
// as real processes for a bounded time, injects the faults that fencing
// tokens exist for (pauses, delayed requests, coordinator crashes and
// stops, partitions, clock drift) and storage faults of fenced's disk (a
// flipped byte, a cut-short log, a data directory put back to an older
// copy, a full disk: storage.go) on a schedule derived from a seed,
// records the history, and checks it:
//
//  1. no fenced request was applied with a token lower than one already
//     applied for its scope;
//  2. per scope, grant tokens are unique and increasing;
//  3. the guarded register is linearizable;
//  4. no acknowledged write was lost.
//
// It also measures the window that eager fencing closes (docs/design.md):
// from the end of each lease, as the service recorded it on its watch
// stream, to the first entry of the resource's log above the lease's
// token, after which the resource refuses it; and the writes the resource
// accepted after their lease had ended. Every other scope (STORE/f1,
// STORE/f3, ...) is followed: a follower (guard/follow) in the resource's
// process advances its marks at each grant and each end of a lease, and the
// report gives the window's distribution with and without one, side by
// side. With --late-bound D, check 5 fails the run when a followed scope
// accepted a write more than D after its lease ended.
//
// Usage:
//
//	fencecheck run [--time 20s] [--seed N] [--workers 4] [--nodes 1|3] [--no-fence] [--late-bound D] ...
//	fencecheck run --stores s3 --s3 http://KEY:SECRET@HOST:PORT/BUCKET ...   # an S3 bucket through s3guard
//	fencecheck check HISTORY.jsonl
//
// run prints a summary with "anomalies: N" and exits 1 when N > 0. Its
// files (history, schedule, logs) go to --dir, or to a temporary directory
// that it removes if the run passes and keeps, saying where, if not.
// With --no-fence the resource applies every write unchecked, and the
// same faults must produce anomalies: a checker that cannot fail proves
// nothing. The worker and resource subcommands are the processes run
// starts by re-executing itself; they are not meant to be run by hand.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/fence-dev/fence/internal/version"
)

// Exit statuses.
const (
	exitOK        = 0
	exitAnomalies = 1 // the checks found anomalies
	exitUsage     = 2
	exitError     = 3 // the run itself could not be carried out
)

func main() {
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) int {
	if len(args) == 0 {
		usage()
		return exitUsage
	}
	var err error
	switch args[0] {
	case "run":
		var code int
		code, err = runCmd(args[1:])
		if err == nil {
			return code
		}
	case "check":
		var code int
		code, err = checkCmd(args[1:])
		if err == nil {
			return code
		}
	case "worker":
		err = workerCmd(args[1:])
	case "resource":
		err = resourceCmd(args[1:])
	case "help", "-h", "--help":
		usage()
		return exitOK
	case "version", "-version", "--version":
		fmt.Print(version.Get().Text("fencecheck"))
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "fencecheck: unknown command %q\n", args[0])
		usage()
		return exitUsage
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "fencecheck:", err)
		return exitUsage
	default:
		fmt.Fprintln(os.Stderr, "fencecheck:", err)
		return exitError
	}
}

type usageError struct{ error }

func usage() {
	fmt.Fprint(os.Stderr, `Usage:
  fencecheck run [flags]        run the processes, inject faults, check the history
  fencecheck check HISTORY      check a history file again
  fencecheck run -h             the flags of run
  fencecheck --version          the build: module version, commit, Go release

Exit status: 0 when every check passes, 1 when anomalies were found,
2 for a usage error, 3 when the run could not be carried out.
`)
}
