// Command fenced is the fence lease service: it grants leases on scopes,
// each with a fencing token greater than every earlier token of the scope,
// and keeps its state in a Raft log in --data-dir.
//
// Every flag can also be set through the environment variable named after
// it: --data-dir is FENCED_DATA_DIR, and so on. Flags win.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fence-dev/fence/internal/server"
)

func main() {
	cfg, err := parse(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := server.Run(ctx, cfg); err != nil {
		cfg.Logger.Error("fenced", "err", err)
		os.Exit(1)
	}
}

func parse(args []string) (server.Config, error) {
	cfg := server.DefaultConfig()
	fs := flag.NewFlagSet("fenced", flag.ContinueOnError)
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the Raft log, stable store and snapshots")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "API address (gRPC, Connect and HTTP/JSON on one port)")
	fs.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's ID in the Raft configuration")
	fs.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "largest TTL an acquire may ask for")
	fs.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "TTL of an acquire that names none")
	format := fs.String("log-format", "text", "log format: text or json")
	level := fs.String("log-level", "info", "log level: debug (shows renewals), info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: fenced [flags]\n\nEach flag may also be set as FENCED_<NAME>, e.g. FENCED_DATA_DIR.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fromEnv(fs); err != nil {
		return cfg, err
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return cfg, fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch *format {
	case "text":
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, opts))
	case "json":
		cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, opts))
	default:
		return cfg, fmt.Errorf("--log-format %q: want text or json", *format)
	}
	return cfg, cfg.Validate()
}

// fromEnv sets each flag from FENCED_<NAME> when that variable is set.
func fromEnv(fs *flag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := "FENCED_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}
