package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// The server and client processes are this binary re-executed with one of
// these as its first argument. A server process prints readyLine on stdout
// once it serves, and stops cleanly on SIGTERM.
const (
	roleClient   = "_client"
	roleEtcd     = "_etcd"
	roleResource = "_resource"
	roleFollower = "_follower"
	readyLine    = "ready"
)

// etcdMain runs an etcd member, embedded, with its defaults: fsync on,
// data in -dir; by default a single-node etcd, with -initial-cluster a
// member of that cluster. -election-timeout sets etcd's election timeout
// and its heartbeat to a tenth of it (etcd's defaults are 1s and 100ms).
func etcdMain(args []string) error {
	fs := flag.NewFlagSet(roleEtcd, flag.ContinueOnError)
	dir := fs.String("dir", "", "data directory")
	client := fs.String("client", "127.0.0.1:2379", "client address")
	peer := fs.String("peer", "127.0.0.1:2380", "peer address")
	name := fs.String("name", "bench", "member name")
	initial := fs.String("initial-cluster", "", "NAME=PEER-URL of every member, comma-separated (default: this member alone)")
	election := fs.Duration("election-timeout", 0, "election timeout, heartbeat a tenth of it (default: etcd's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dir
	if *election > 0 {
		if *election%(10*time.Millisecond) != 0 {
			return fmt.Errorf("-election-timeout %s: want a whole number of 10ms", *election)
		}
		cfg.ElectionMs, cfg.TickMs = uint(election.Milliseconds()), uint(election.Milliseconds()/10)
	}
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cu := url.URL{Scheme: "http", Host: *client}
	pu := url.URL{Scheme: "http", Host: *peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if *initial != "" {
		cfg.InitialCluster = *initial
	}
	if cfg.UnsafeNoFsync {
		return errors.New("etcd: fsync is off")
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		return errors.New("etcd: not ready after 60s")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println(readyLine)
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}
