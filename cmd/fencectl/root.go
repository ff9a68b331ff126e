package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/version"
)

// Exit statuses. exec also exits with its command's own status.
const (
	exitOK        = 0
	exitError     = 1   // anything else that went wrong
	exitUsage     = 2   // bad flags or arguments, or a request the service rejected as invalid
	exitHeld      = 3   // the scope is held by another lease
	exitLeaseLost = 4   // exec: the command was stopped because its lease was lost
	exitUnauthed  = 5   // the service needs credentials, and got none it knows
	exitDenied    = 6   // the service knows the caller, and its rules do not allow the call
	exitUnknown   = 7   // the service does not know the call: older than fencectl
	exitCannotRun = 126 // exec: the command was found but could not be started
	exitNotFound  = 127 // exec: the command was not found
)

const rootLong = `fencectl talks to a fenced lease service.

A lease gives one holder authority over a scope (a name such as orders or
orders/shard-7) for a TTL. Every grant carries a fencing token, greater than
every earlier token of the scope: present it with each write, so the resource
can refuse writes from an older holder. The lease ID proves who may renew or
release a lease; the token proves recency.

Output:
  -o text (the default) is for people.
  -o json prints exactly one JSON object on stdout, on one line, for scripts.
  It is the API's shape: what the API answers for the same call, in
  protobuf's JSON mapping, as curl gets it: names in lowerCamelCase
  (leaseId, lastToken), 64-bit integers such as token as strings of digits,
  durations as seconds ("10s", "9.998s"), enums by name, fields at their
  zero value left out. acquire and renew print {"lease": LEASE}, with a
  LEASE of scope, token, leaseId (the service tells it only to the holder),
  holder, ttl, expiresIn and tokenText (grantedAt is not printed); get
  prints {"scope", "lease" (while held, without leaseId), "lastToken",
  "waiters"}; list {"leases": [LEASE, ...]}; release {"scope", "token"};
  cluster status {"nodes": [NODE, ...], "leader", "nodeId", "term",
  "commitIndex", "appliedIndex"}; watch one WatchEvent per line, as events
  come. Commands with no API call of their own follow the same rules.
  A failure prints
    {"error": MESSAGE, "code": CODE, "exitStatus": N}
  with CODE one of usage, invalid, held, lease_lost, not_holder, unavailable,
  timeout, interrupted, tokens_exhausted, missed_events, unauthenticated,
  permission_denied, unimplemented, error; a held error adds scope,
  holder, token and expiresIn of the lease in the way.
  Errors always also go to stderr as "fencectl: MESSAGE".
  exec never writes to stdout: stdout belongs to its command.

Exit status:
  0    success
  1    error: the service is unreachable, the lease is lost or not yours,
       a timeout, an interrupt
  2    usage error: bad flags or arguments, a malformed scope, lease ID or
       TTL, or a request the service rejected as invalid (such as a --ttl
       above its --max-ttl)
  3    the scope is held by another lease; the message names its holder,
       its token and its time left
  5    unauthenticated: the service needs credentials (--auth-token or
       --cert/--key) and got none it knows
  6    permission denied: the service's rules do not allow this caller the
       call, or the scope
  7    unimplemented: the service does not know the call; it runs an older
       fenced than this fencectl
  exec exits with its command's status (128+N if the command was killed by
  signal N), or:
  4    the command was stopped because the lease was lost
  126  the command could not be started
  127  the command was not found

Environment:
  FENCE_CA, FENCE_CERT, FENCE_KEY, FENCE_AUTH_TOKEN  as --ca, --cert, --key, --auth-token
  FENCE_ADDR  the service's address, when --addr is not given: one
              host:port, or a cluster's nodes comma-separated, such as
              10.0.0.1:7481,10.0.0.2:7481,10.0.0.3:7481. Calls go to the
              first that answers; when a node fails, fencectl retries at
              the next one, for up to 10s in all.`

const rootExample = `  # Take a lease by hand, renew it within its TTL, release it.
  fencectl acquire orders --holder alice --ttl 30s
  fencectl renew orders --lease 9f86d081884c7d659a2feaa0c55ad015
  fencectl release orders --lease 9f86d081884c7d659a2feaa0c55ad015

  # Who holds what.
  fencectl get orders
  fencectl list orders/

  # Run a job only while holding the lease; it reads $FENCE_TOKEN.
  fencectl exec orders --wait -- ./nightly-export.sh

  # A cluster: list every node; any live one answers.
  fencectl cluster status --addr 10.0.0.1:7481,10.0.0.2:7481,10.0.0.3:7481`

// app holds what every command shares: the global flags and the process's
// standard streams. It is used by one command run at a time.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	addr    string // --addr
	output  string // --output: "text" or "json"
	tls     tlsFlags
	started bool // a command's RunE began: its errors are not usage errors
}

// execute runs fencectl with args and returns its exit status.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, output: "text"}
	root := a.newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	return a.fail(cmd, err)
}

func (a *app) newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "fencectl",
		Short:         "Acquire, inspect and release fence leases; run a command under a lease",
		Long:          rootLong,
		Example:       rootExample,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if a.output != "text" && a.output != "json" {
				bad := a.output
				a.output = "text"
				return usageErrorf("--output %q: want text or json", bad)
			}
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	root.Version = version.Get().Short()
	root.SetVersionTemplate(version.Get().Text("fencectl"))
	addr := client.DefaultAddr
	if v, ok := os.LookupEnv("FENCE_ADDR"); ok && v != "" {
		addr = v
	}
	pf := root.PersistentFlags()
	pf.StringVar(&a.addr, "addr", addr, "the fenced service's host:port or http:// URL, or a cluster's, comma-separated (env FENCE_ADDR)")
	pf.StringVarP(&a.output, "output", "o", "text", "output format: text (for people) or json (one object on stdout, for scripts)")
	pf.StringVar(&a.tls.ca, "ca", os.Getenv("FENCE_CA"), "PEM CA that signed the service's certificate: talk TLS (env FENCE_CA)")
	pf.StringVar(&a.tls.cert, "cert", os.Getenv("FENCE_CERT"), "PEM client certificate, for a service that checks them (env FENCE_CERT)")
	pf.StringVar(&a.tls.key, "key", os.Getenv("FENCE_KEY"), "PEM private key of --cert (env FENCE_KEY)")
	pf.StringVar(&a.tls.bearer, "auth-token", os.Getenv("FENCE_AUTH_TOKEN"), "bearer token, for a service with an auth file (env FENCE_AUTH_TOKEN)")

	root.AddCommand(
		a.newAcquireCmd(),
		a.newDemoCmd(),
		a.newRenewCmd(),
		a.newReleaseCmd(),
		a.newGetCmd(),
		a.newListCmd(),
		a.newExecCmd(),
		a.newWatchCmd(),
		a.newClusterCmd(),
		a.newTokenCmd(),
		a.newGuardCmd(),
		a.newBackupCmd(),
	)
	return root
}

// run wraps a command's body: from here on its errors are not usage
// errors unless it says so.
func (a *app) run(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.started = true
		return f(cmd, args)
	}
}

// client returns a client of --addr, which may list several nodes.
func (a *app) client() (*client.Client, error) {
	opts, err := a.tls.options()
	if err != nil {
		return nil, usage(err)
	}
	c, err := client.New(a.addr, opts...)
	if err != nil {
		return nil, usageErrorf("--addr: %v", err)
	}
	return c, nil
}

// tlsFlags are the transport security and credential flags.
type tlsFlags struct{ ca, cert, key, bearer string }

func (f tlsFlags) options() ([]client.Option, error) {
	var opts []client.Option
	if f.bearer != "" {
		opts = append(opts, client.WithBearerToken(f.bearer))
	}
	tc, err := f.config()
	if tc != nil {
		opts = append(opts, client.WithTLS(tc))
	}
	return opts, err
}

// config is the TLS configuration the flags ask for; nil for none.
func (f tlsFlags) config() (*tls.Config, error) {
	if f.ca == "" && f.cert == "" && f.key == "" {
		return nil, nil
	}
	if (f.cert == "") != (f.key == "") {
		return nil, errors.New("--cert and --key go together")
	}
	tc := &tls.Config{}
	if f.ca != "" {
		b, err := os.ReadFile(f.ca)
		if err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--ca %s: no PEM certificate in it", f.ca)
		}
	}
	if f.cert != "" {
		c, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--cert/--key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
}

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// usage marks err, typically a *fence.InvalidError from local validation,
// as a usage error.
func usage(err error) error { return &usageError{err} }

// statusError ends fencectl with a given exit status. A nil err prints
// nothing: exec passing on its command's status.
type statusError struct {
	code int
	name string // the JSON error code
	err  error
}

func (e *statusError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *statusError) Unwrap() error { return e.err }

// exactArgs accepts exactly the named positional arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < len(names):
			return usageErrorf("missing %s", names[len(args)])
		case len(args) > len(names):
			return usageErrorf("unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

// checkTTL rejects TTLs the service could only misread: zero would mean
// "the service's default", which a person typing --ttl 0 did not mean.
func checkTTL(d time.Duration) error {
	if d <= 0 {
		return usageErrorf("--ttl %v: want a positive duration such as 10s", d)
	}
	return nil
}

// classify maps an error to an exit status and a JSON error code.
func (a *app) classify(err error) (int, string) {
	var se *statusError
	var ue *usageError
	switch {
	case errors.As(err, &se):
		return se.code, se.name
	case errors.As(err, &ue), !a.started:
		return exitUsage, "usage"
	case errors.Is(err, fence.ErrInvalid):
		return exitUsage, "invalid"
	case errors.Is(err, fence.ErrHeld):
		return exitHeld, "held"
	case errors.Is(err, fence.ErrLeaseLost):
		return exitError, "lease_lost"
	case errors.Is(err, fence.ErrNotHolder):
		return exitError, "not_holder"
	case errors.Is(err, fence.ErrTokensExhausted):
		return exitError, "tokens_exhausted"
	case errors.Is(err, fence.ErrMissedEvents):
		return exitError, "missed_events"
	case errors.Is(err, fence.ErrUnauthenticated):
		return exitUnauthed, "unauthenticated"
	case errors.Is(err, fence.ErrPermissionDenied):
		return exitDenied, "permission_denied"
	case errors.Is(err, fence.ErrUnimplemented):
		return exitUnknown, "unimplemented"
	case errors.Is(err, fence.ErrUnavailable):
		return exitError, "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return exitError, "timeout"
	case errors.Is(err, context.Canceled):
		return exitError, "interrupted"
	}
	return exitError, "error"
}

// fail reports err and returns the exit status for it.
func (a *app) fail(cmd *cobra.Command, err error) int {
	code, name := a.classify(err)
	var se *statusError
	if errors.As(err, &se) && se.err == nil {
		return code
	}
	fmt.Fprintf(a.stderr, "fencectl: %v\n", err)
	if name == "usage" && cmd != nil {
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	if a.output == "json" && (cmd == nil || cmd.Name() != "exec") {
		a.writeJSON(errorOut(err, name, code))
	}
	return code
}
