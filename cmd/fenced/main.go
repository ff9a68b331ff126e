// Command fenced is the fence lease service: it grants leases on scopes,
// each with a fencing token greater than every earlier token of the scope,
// and keeps its state in a Raft log in --data-dir.
//
// Every flag can also be set through the environment variable named after
// it: --data-dir is FENCED_DATA_DIR, and so on. Flags win.
//
// Without --raft-listen, fenced is a single node. A cluster starts with
//
//	fenced --node-id n1 --listen :7481 --advertise 10.0.0.1:7481 --raft-listen 10.0.0.1:7491 --bootstrap
//
// on the first node, and grows with
//
//	fenced --node-id n2 --listen :7481 --advertise 10.0.0.2:7481 --raft-listen 10.0.0.2:7491 --join 10.0.0.1:7481
//
// on each other node (keep --join on its command line: a restart re-joins
// at the same addresses harmlessly; a node that moved rejoins at its new
// addresses only authenticated as itself, with auth on, or after an
// operator's "fencectl cluster add ID --replace", docs/operations.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fence-dev/fence/internal/server"
	"github.com/fence-dev/fence/internal/version"
)

func main() {
	logs := newLogWriter(os.Stderr)
	opts, err := parse(os.Args[1:], logs)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced:", err)
		os.Exit(2)
	}
	if opts.version {
		fmt.Print(version.Get().Text("fenced"))
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	limit, from := opts.memoryLimit.apply()
	opts.Logger.Info("memory limit", "limit", (&memoryLimit{bytes: limit}).String(), "from", from)
	go watchLiveHeap(ctx, opts.Logger, limit, 30*time.Second)
	err = server.Run(ctx, opts.Config)
	if err != nil {
		opts.Logger.Error("fenced", "err", err)
	}
	logs.Close()
	if err != nil {
		os.Exit(1)
	}
}

// options are fenced's flags: the server's configuration, and what the
// process sets for itself.
type options struct {
	server.Config
	memoryLimit memoryLimit
	version     bool // --version: print the build and exit
}

// parse reads fenced's flags and environment; its logger writes to logOut.
func parse(args []string, logOut io.Writer) (options, error) {
	o := options{Config: server.DefaultConfig()}
	cfg := &o.Config
	fs := flag.NewFlagSet("fenced", flag.ContinueOnError)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the Raft log, stable store and snapshots")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "API address (gRPC, Connect and HTTP/JSON on one port)")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's ID in the Raft configuration")
	fs.StringVar(&cfg.Advertise, "advertise", "", "API address peers forward requests to (default: the address --listen bound)")
	fs.StringVar(&cfg.RaftListen, "raft-listen", "", "Raft address, for a node of a cluster (default: none, a single node that never has peers)")
	fs.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address peers dial (default: --raft-listen)")
	fs.StringVar(&cfg.Restore, "restore", "", "start a new one-voter cluster from this backup file (fencectl backup, or a snapshot's state.bin); the data directory must be empty; the restored node's tokens start above its wall clock (the token floor)")
	fs.BoolVar(&cfg.Bootstrap, "bootstrap", false, "start a new cluster with this node as its only voter (first start of the first node only)")
	join := fs.String("join", "", "comma-separated API addresses of cluster members to ask to add this node")
	fs.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "how long, on average, followers go without hearing from the leader before they elect another (each gives up after half to one and a half times this)")
	fs.StringVar(&cfg.RaftLog, "raft-log", "", "Raft log store: wal (raft-wal, one fsync per append) or bolt (raft-boltdb, two); empty keeps the one the data directory holds, and makes wal in a new one")
	fs.IntVar(&cfg.RaftSegmentSize, "raft-segment-size", 64<<20, "bytes of a raft-wal segment file (--raft-log wal): compacted entries are dropped a whole segment at a time")
	fs.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", 8192, "log entries after which a snapshot is taken and the log compacted")
	fs.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", 120*time.Second, "how often to check --snapshot-threshold (randomised up to twice this)")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "largest TTL an acquire may ask for")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "TTL of an acquire that names none")
	fs.StringVar(&cfg.TLS.Cert, "tls-cert", "", "PEM certificate: serve the API over TLS only")
	fs.StringVar(&cfg.TLS.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.TLS.ClientCA, "tls-client-ca", "", "PEM CA: require client certificates it signed (mutual TLS); a certificate's common name is its identity")
	fs.StringVar(&cfg.TLS.CA, "tls-ca", "", "PEM CA that signs the nodes' certificates; only its certificates can be nodes (default: --tls-client-ca)")
	fs.StringVar(&cfg.AuthFile, "auth-file", "", "JSON file of identities, bearer token hashes and rules; turns authorization on (default deny)")
	fs.IntVar(&cfg.MaxLeasesPerIdentity, "max-leases-per-identity", cfg.MaxLeasesPerIdentity, "most leases one identity (--auth-file), or with auth off one holder name, may hold at once (0: no limit)")
	fs.IntVar(&cfg.MaxWaitersPerIdentity, "max-waiters-per-identity", cfg.MaxWaitersPerIdentity, "most acquires with wait one identity, or with auth off one holder name, may have under way at once (0: no limit)")
	fs.IntVar(&cfg.MaxWaiters, "max-waiters", cfg.MaxWaiters, "most acquires that may wait in one scope's line; more are answered held (0: no limit)")
	fs.IntVar(&cfg.MaxConns, "max-conns", cfg.MaxConns, "most API connections open at once, by default 3/4 of the open-file limit (ulimit -n); more are closed as soon as accepted")
	fs.IntVar(&cfg.MaxConnsPerAddr, "max-conns-per-addr", cfg.MaxConnsPerAddr, "most API connections open at once from one IP address, or one IPv6 /64 (clients behind one NAT or proxy share it); more are closed as soon as accepted")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "longest time to read a whole request, body included; a slower request fails and its connection is closed (watches and waiting acquires are not affected)")
	fs.BoolVar(&cfg.SignTokens, "sign-tokens", cfg.SignTokens, "sign every token (Ed25519; public keys at GET /keys); false hands out unsigned tokens, which a guard cannot tell from forged ones")
	fs.DurationVar(&cfg.KeyGrace, "key-grace", cfg.KeyGrace, "how long tokens signed by a rotated-out key keep verifying")
	fs.DurationVar(&cfg.KeyPublishDelay, "key-publish-delay", cfg.KeyPublishDelay, "how long a rotated-in key is published at /keys before it signs; keep it above the guards' key refresh interval (0: it signs at once)")
	fs.Var(&o.memoryLimit, "memory-limit", "the Go runtime's soft memory limit (e.g. 448MiB, 2GiB, or off): the collector works harder near it; a held lease costs about 340 bytes (default 448MiB, or 90% of the cgroup's memory limit if lower; GOMEMLIMIT, when set, instead)")
	fs.Uint64Var(&cfg.MinFreeSpace, "min-free-space", 0, "bytes the data directory's disk keeps free: below it the leader refuses new grants (unavailable) and /readyz answers 503, before a full disk stops the node (0: twice --raft-segment-size, or 64 MiB with --raft-log bolt)")
	fs.Uint64Var(&cfg.TokenFloor, "token-floor", 0, "every token granted after this node takes office is above this one (default: the wall clock in microseconds, which a new leader always sets); for a restore onto a machine whose clock is behind the old one's")
	fs.BoolVar(&o.version, "version", false, "print the build (module version, commit, Go release) and exit")
	format := fs.String("log-format", "text", "log format: text or json")
	level := fs.String("log-level", "info", "log level: debug (shows renewals), info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: fenced [flags]\n\nEach flag may also be set as FENCED_<NAME>, e.g. FENCED_DATA_DIR.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fromEnv(fs); err != nil {
		return o, err
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if o.version {
		return o, nil
	}
	if *join != "" {
		for a := range strings.SplitSeq(*join, ",") {
			if a = strings.TrimSpace(a); a == "" {
				return o, fmt.Errorf("--join %q: an empty address", *join)
			}
			cfg.Join = append(cfg.Join, strings.TrimSpace(a))
		}
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return o, fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch *format {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(logOut, opts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(logOut, opts))
	default:
		return o, fmt.Errorf("--log-format %q: want text or json", *format)
	}
	return o, cfg.Validate()
}

// fromEnv sets each flag from FENCED_<NAME> when that variable is set,
// except --version: an environment that sets FENCED_VERSION means
// something else by it.
func fromEnv(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "version" {
			return
		}
		name := "FENCED_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}
