package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/httpguard"
)

// The server and client processes are this binary re-executed with one of
// these as its first argument. A server process prints readyLine on stdout
// once it serves, and stops cleanly on SIGTERM.
const (
	roleClient   = "_client"
	roleEtcd     = "_etcd"
	roleResource = "_resource"
	readyLine    = "ready"
)

// etcdMain runs a single-node etcd, embedded, with its defaults: fsync on,
// data in -dir.
func etcdMain(args []string) error {
	fs := flag.NewFlagSet(roleEtcd, flag.ContinueOnError)
	dir := fs.String("dir", "", "data directory")
	client := fs.String("client", "127.0.0.1:2379", "client address")
	peer := fs.String("peer", "127.0.0.1:2380", "peer address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = *dir
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	cu := url.URL{Scheme: "http", Host: *client}
	pu := url.URL{Scheme: "http", Host: *peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
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

// resourceMain runs the guarded resource of the guarded-write workload: an
// HTTP service keeping its data in a bbolt file (fsync on). POST
// /write/SCOPE stores the body under SCOPE in the transaction that checks
// and advances SCOPE's fencing mark, through httpguard over boltguard's
// Batched store, which commits concurrent writes together; with -solo over
// the Store itself, one commit per write.
var dataBucket = []byte("data")

func resourceMain(args []string) error {
	fs := flag.NewFlagSet(roleResource, flag.ContinueOnError)
	dir := fs.String("dir", "", "data directory")
	listen := fs.String("listen", "127.0.0.1:0", "HTTP address")
	solo := fs.Bool("solo", false, "commit each write on its own (boltguard.Store instead of its Batched store)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	store, err := boltguard.Open(filepath.Join(*dir, "resource.db"))
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.DB().Update(func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(dataBucket)
		return err
	}); err != nil {
		return err
	}
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, ok := boltguard.TxFromContext(r.Context())
		if !ok {
			http.Error(w, "no transaction", http.StatusInternalServerError)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if err := tx.Bucket(dataBucket).Put([]byte(r.PathValue("scope")), body); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	fences := store.Batched()
	if *solo {
		fences = store
	}
	fenced := httpguard.Middleware(guard.New(fences), "", httpguard.WithScopeFunc(func(r *http.Request) string {
		return r.PathValue("scope")
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /write/{scope...}", fenced(write))
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fmt.Println(readyLine)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}
