package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"connectrpc.com/connect"

	"github.com/fence-dev/fence"
	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/internal/wire"
)

func startWith(t *testing.T, edit func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Listen = t.TempDir(), "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	edit(&cfg)
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	for deadline := time.Now().Add(20 * time.Second); !s.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
	}
	return s
}

func h2cClient(buf uint32) *http.Client {
	tr := h2c()
	if buf > 0 {
		tr.HTTP2 = &http.HTTP2Config{MaxReceiveBufferPerConnection: int(buf), MaxReceiveBufferPerStream: int(buf)}
	}
	return &http.Client{Transport: tr}
}

// TestMaxWaiters: with --max-waiters 2, a third acquire that would wait is
// answered held, saying the line is full, and joins nothing.
func TestMaxWaiters(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxWaiters = 2 })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "a", Holder: "h"})); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		go rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "a", Holder: fmt.Sprint("w", i), Wait: true}))
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		g, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "a"}))
		if err == nil && g.Msg.Waiters == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("two waiters never queued: %v %v", g, err)
		}
	}
	_, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "a", Holder: "third", Wait: true}))
	if !errors.Is(wire.FromConnect(err), fence.ErrHeld) || !strings.Contains(err.Error(), "line of waiters is full") {
		t.Fatalf("a third waiter: %v; want held, line full", err)
	}
	if g, _ := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "a"})); g.Msg.Waiters != 2 {
		t.Fatalf("%d waiters after the refusal, want 2", g.Msg.Waiters)
	}
}

// TestSlowReaderIsCutOff: a watcher that stops reading while events pile up
// has its connection closed once nothing can be written to it for the
// write timeout, instead of holding the server's buffers for ever.
func TestSlowReaderIsCutOff(t *testing.T) {
	s := startWith(t, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	slow := fencev1connect.NewLeaseServiceClient(h2cClient(64<<10), "http://"+s.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := slow.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: ""}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	fast := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())

	// A watch that is merely quiet for longer than the timeout is kept.
	idle, err := fast.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: "idle/"}))
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if !idle.Receive() { // the first answer comes at once
		t.Fatal(idle.Err())
	}
	time.Sleep(time.Second)
	if _, err := fast.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "idle/a", Holder: "h"})); err != nil {
		t.Fatal(err)
	}
	for idle.Receive() && len(idle.Msg().Events) == 0 {
	}
	if idle.Err() != nil || len(idle.Msg().Events) == 0 || idle.Msg().Events[0].Scope != "idle/a" {
		t.Fatalf("a watch quiet for 1s (timeout 300ms): %v, %v; want the grant of idle/a", idle.Msg(), idle.Err())
	}

	// Far more events than the watcher's 64 KiB window holds.
	for i := range 600 {
		scope := fmt.Sprintf("slow/%03d-%s", i, strings.Repeat("x", 100))
		r, err := fast.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: strings.Repeat("h", 100)}))
		if err != nil {
			t.Fatal(err)
		}
		fast.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: scope, LeaseId: r.Msg.Lease.LeaseId}))
	}
	time.Sleep(2 * time.Second) // well past the write timeout, not reading
	n := 0
	for stream.Receive() {
		n++
	}
	if stream.Err() == nil || ctx.Err() != nil {
		t.Fatalf("the stalled watcher read %d messages and then %v; want its connection cut", n, stream.Err())
	}
	t.Logf("the stalled watcher read %d messages, then: %v", n, stream.Err())
}

// TestMaxLeasesPerIdentity: with auth on and a limit of 2, an identity's
// third lease is refused until it releases one, another identity is not
// affected, and the count survives a restart (it is rebuilt from the
// owners recorded with the leases).
func TestMaxLeasesPerIdentity(t *testing.T) {
	dir := t.TempDir()
	authFile := filepath.Join(dir, "auth.json")
	var tokens []string
	for _, tok := range []string{"alice-secret", "bob-secret"} {
		sum := sha256.Sum256([]byte(tok))
		tokens = append(tokens, hex.EncodeToString(sum[:]))
	}
	os.WriteFile(authFile, fmt.Appendf(nil, `{"tokens": [{"identity": "alice", "sha256": %q}, {"identity": "bob", "sha256": %q}],
		"rules": [{"identity": "alice", "prefix": "", "allow": ["acquire", "release"]}, {"identity": "bob", "prefix": "", "allow": ["acquire"]}]}`, tokens[0], tokens[1]), 0o600)
	data := t.TempDir()
	edit := func(c *Config) { c.AuthFile, c.MaxLeasesPerIdentity, c.DataDir = authFile, 2, data }
	s := startWith(t, edit)
	as := func(s *Server, tok string) fencev1connect.LeaseServiceClient {
		return fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr(), connect.WithInterceptors(testBearer("Bearer "+tok)))
	}
	ctx := context.Background()
	acquire := func(c fencev1connect.LeaseServiceClient, scope string) (*fencev1.Lease, error) {
		r, err := c.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: "h", Ttl: durationpb.New(time.Minute)}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Lease, nil
	}
	alice := as(s, "alice-secret")
	first, err := acquire(alice, "a/1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(alice, "a/2"); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(alice, "a/3"); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "holds 2 leases") {
		t.Fatalf("alice's third lease: %v; want resource_exhausted, holds 2 leases", err)
	}
	if _, err := acquire(as(s, "bob-secret"), "b/1"); err != nil {
		t.Fatalf("bob is not limited by alice's leases: %v", err)
	}
	if _, err := alice.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "a/1", LeaseId: first.LeaseId})); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire(alice, "a/3"); err != nil {
		t.Fatalf("after a release: %v", err)
	}

	s.Close(ctx)
	s2 := startWith(t, edit)
	if _, err := acquire(as(s2, "alice-secret"), "a/4"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("after a restart, alice's third lease: %v; want resource_exhausted", err)
	}
}

// TestMaxLeasesPerHolder: with auth off the lease limit counts by holder
// name: a holder's third lease is refused, alone or in a batch, another
// holder is not affected, and a release makes room.
func TestMaxLeasesPerHolder(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxLeasesPerIdentity = 2 })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx := context.Background()
	acquire := func(scope, holder string) (*fencev1.Lease, error) {
		r, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: holder}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Lease, nil
	}
	first, err := acquire("a/1", "leaky")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acquire("a/2", "leaky"); err != nil {
		t.Fatal(err)
	}
	_, err = acquire("a/3", "leaky")
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), `holder "leaky" holds 2 leases`) {
		t.Fatalf("leaky's third lease: %v; want resource_exhausted, holder \"leaky\" holds 2 leases", err)
	}
	// A batch of three for a fresh holder: two granted, the third refused.
	var batch []*fencev1.AcquireRequest
	for i := range 3 {
		batch = append(batch, &fencev1.AcquireRequest{Scope: fmt.Sprint("b/", i), Holder: "batcher"})
	}
	br, err := rpc.AcquireBatch(ctx, connect.NewRequest(&fencev1.AcquireBatchRequest{Acquires: batch}))
	if err != nil {
		t.Fatal(err)
	}
	var granted int
	for _, r := range br.Msg.Results {
		if r.Lease != nil {
			granted++
		} else if !strings.Contains(r.Failure.GetMessage(), `holder "batcher" holds 2 leases`) {
			t.Errorf("batch item refused with %v; want holder \"batcher\" holds 2 leases", r.Failure)
		}
	}
	if granted != 2 {
		t.Errorf("a batch of 3 for one holder with a limit of 2: %d granted", granted)
	}
	if _, err := acquire("c/1", "other"); err != nil {
		t.Fatalf("another holder is not limited by leaky's leases: %v", err)
	}
	if _, err := rpc.Release(ctx, connect.NewRequest(&fencev1.ReleaseRequest{Scope: "a/1", LeaseId: first.LeaseId})); err != nil {
		t.Fatal(err)
	}
	if _, err := acquire("a/3", "leaky"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// TestMaxWaitersPerIdentity: with a limit of 2 (auth off: per holder), a
// holder's third acquire that may wait is refused while two wait, in other
// scopes' lines too; another holder may still wait.
func TestMaxWaitersPerIdentity(t *testing.T) {
	s := startWith(t, func(c *Config) { c.MaxWaitersPerIdentity = 2 })
	rpc := fencev1connect.NewLeaseServiceClient(h2cClient(0), "http://"+s.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, scope := range []string{"a", "b", "c", "d"} {
		if _, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: "owner"})); err != nil {
			t.Fatal(err)
		}
	}
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	for _, scope := range []string{"a", "b"} {
		go rpc.Acquire(waitCtx, connect.NewRequest(&fencev1.AcquireRequest{Scope: scope, Holder: "greedy", Wait: true}))
	}
	for _, scope := range []string{"a", "b"} {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			g, err := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: scope}))
			if err == nil && g.Msg.Waiters == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("greedy never queued for %s: %v %v", scope, g, err)
			}
		}
	}
	_, err := rpc.Acquire(ctx, connect.NewRequest(&fencev1.AcquireRequest{Scope: "c", Holder: "greedy", Wait: true}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), `holder "greedy" has 2 acquires waiting`) {
		t.Fatalf("greedy's third waiting acquire: %v; want resource_exhausted, holder \"greedy\" has 2 acquires waiting", err)
	}
	if g, _ := rpc.Get(ctx, connect.NewRequest(&fencev1.GetRequest{Scope: "c"})); g.Msg.Waiters != 0 {
		t.Fatalf("%d waiters in c after the refusal, want 0", g.Msg.Waiters)
	}
	// Another holder may wait; its wait ends with its context.
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancelShort()
	if _, err := rpc.Acquire(short, connect.NewRequest(&fencev1.AcquireRequest{Scope: "d", Holder: "patient", Wait: true})); connect.CodeOf(err) == connect.CodeResourceExhausted {
		t.Fatalf("another holder's wait: %v; want it to wait, not be refused", err)
	}
}

// TestAuthWithoutTLSWarns: --auth-file over plain HTTP logs one warning
// that bearer tokens travel in clear text.
func TestAuthWithoutTLSWarns(t *testing.T) {
	authFile := filepath.Join(t.TempDir(), "auth.json")
	os.WriteFile(authFile, []byte(`{"rules": []}`), 0o600)
	var logs lockedLog
	startWith(t, func(c *Config) {
		c.AuthFile = authFile
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	var warns []string
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "clear text") {
			warns = append(warns, line)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "--tls-cert") {
		t.Fatalf("warnings about bearer tokens in clear text: %q; want one, naming --tls-cert", warns)
	}
}
