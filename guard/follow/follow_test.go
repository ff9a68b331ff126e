package follow_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"go.uber.org/goleak"
	"golang.org/x/sync/errgroup"

	"github.com/fence-dev/fence"
	fencev1connect "github.com/fence-dev/fence/api/fence/v1/fencev1connect"
	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/boltguard"
	"github.com/fence-dev/fence/guard/follow"
	"github.com/fence-dev/fence/internal/server"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// run runs f until the test ends.
func run(t *testing.T, f *follow.Follower) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	})
}

// following runs f until the test ends, and waits until the service has
// taken its watch: a follower sees the events from then on (and, over a
// guard.Lister, the state of the scopes its store lists), so a grant made
// before that, on a busy machine, would go unseen.
func following(t *testing.T, f *follow.Follower) {
	t.Helper()
	run(t, f)
	waitFor(t, "the service to take the follower's watch", func() bool { return f.Position() != 0 })
}

// waitFor polls cond until it holds, or fails the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
	}
}

// write fences a write of token v to scope in s.
func write(s guard.Store, scope string, v uint64) error {
	return s.Fence(context.Background(), guard.Write{Token: fence.Token{Scope: scope, Value: v}}, false, func(context.Context) error { return nil })
}

// TestFollowRefusesEndedLease (invariant 9 at the resource): a lease is
// released, or expires; its holder's late write, before anyone else
// wrote, is refused by the store a follower keeps, and accepted by the
// same store without one: the window a follower closes.
func TestFollowRefusesEndedLease(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	followed, plain := guard.NewMemoryStore(), guard.NewMemoryStore()
	f := follow.New(c, followed, "orders/", follow.WithLogger(quiet))
	following(t, f)

	for _, end := range []string{"released", "expired"} {
		t.Run(end, func(t *testing.T) {
			scope := "orders/" + end
			ttl := time.Minute
			if end == "expired" {
				// Granted, never renewed; long enough for the holder's write
				// to land before the follower closes the token, even on a
				// busy machine.
				ttl = time.Second
			}
			l, err := c.Grant(ctx, scope, client.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range []guard.Store{followed, plain} {
				if err := write(s, scope, l.Token); err != nil {
					t.Fatalf("the holder's write: %v", err)
				}
			}
			if end == "released" {
				if _, err := c.Release(ctx, scope, l.ID); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, "the lease's end", func() bool {
				st, err := c.Get(ctx, scope)
				return err == nil && st.Lease == nil
			})
			waitFor(t, "the follower to advance the mark to the closing", func() bool {
				return followed.Highest(scope).Token == l.Token+1
			})

			// The old holder's delayed write arrives; nobody else wrote.
			err = write(followed, scope, l.Token)
			var stale *guard.StaleError
			if !errors.As(err, &stale) || stale.Presented != l.Token || stale.Highest != l.Token+1 {
				t.Errorf("late write with a follower = %v, want refused as stale (highest %d)", err, l.Token+1)
			}
			if err := write(plain, scope, l.Token); err != nil {
				t.Errorf("late write without a follower = %v; want accepted, the window a follower closes", err)
			}
			// The next holder is above the closing.
			next, err := c.Grant(ctx, scope)
			if err != nil || next.Token != l.Token+2 {
				t.Fatalf("next grant: %+v, %v; want token %d", next, err, l.Token+2)
			}
			if err := write(followed, scope, next.Token); err != nil {
				t.Errorf("the next holder's write: %v", err)
			}
		})
	}
}

// TestFollowNeverGoesBack: a mark above the service's tokens (another
// writer's) stays where it is; the follower uses the store's monotonic
// advance.
func TestFollowNeverGoesBack(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	store := guard.NewMemoryStore()
	if err := write(store, "a/high", 1000); err != nil {
		t.Fatal(err)
	}
	f := follow.New(c, store, "a/", follow.WithLogger(quiet))
	following(t, f)
	l, err := c.Grant(ctx, "a/high")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "a/high", l.ID); err != nil {
		t.Fatal(err)
	}
	// A scope after it, so that once its mark moves, a/high's did.
	m, err := c.Grant(ctx, "a/later")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a/later's mark", func() bool { return store.Highest("a/later").Token == m.Token })
	if got := store.Highest("a/high").Token; got != 1000 {
		t.Errorf("a/high's mark = %d, want 1000 kept", got)
	}
	if _, err := c.Grant(ctx, "b/other"); err != nil {
		t.Fatal(err)
	}
	if store.Highest("b/other").Token != 0 {
		t.Error("a scope outside the prefix was advanced")
	}
}

// flaky is a store that fails while down is set.
type flaky struct {
	guard.Store
	down atomic.Bool
}

func (s *flaky) Fence(ctx context.Context, w guard.Write, strict bool, apply func(context.Context) error) error {
	if s.down.Load() {
		return errors.New("the store is down")
	}
	return s.Store.Fence(ctx, w, strict, apply)
}

// TestFollowRetriesTheStore: an advance the store fails is retried, not
// dropped, and Lag says how long it waits.
func TestFollowRetriesTheStore(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	mem := guard.NewMemoryStore()
	store := &flaky{Store: mem}
	store.down.Store(true)
	f := follow.New(c, store, "", follow.WithLogger(quiet))
	following(t, f)
	l, err := c.Grant(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "s", l.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a lag while the store is down", func() bool { return f.Lag() > 50*time.Millisecond })
	// The lag counts from the grant's time at the service (or from Run,
	// before the watch started), not from the store's first refusal: wait
	// for that refusal too.
	waitFor(t, "the store's error in LastError", func() bool {
		at, err := f.LastError()
		return err != nil && strings.Contains(err.Error(), "the store is down") && !at.IsZero()
	})
	store.down.Store(false)
	waitFor(t, "the closing recorded once the store is back", func() bool { return mem.Highest("s").Token == l.Token+1 })
	waitFor(t, "no lag", func() bool { return f.Lag() == 0 })
}

// TestFollowReportsProgress: a follower that has not reached the service
// says so (a lag growing from the start of Run, position 0, the watch's
// error); one that follows reports the position it has everything up to,
// moving with each event, and no lag once caught up.
func TestFollowReportsProgress(t *testing.T) {
	ctx := testContext(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := ln.Addr().String()
	ln.Close() // refuses connections from now on
	// A client that keeps trying for a minute: the watch has not failed
	// yet, and the follower is behind all the same.
	patient, err := client.New(nowhere, client.WithRetryTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer patient.Close()
	cut := follow.New(patient, guard.NewMemoryStore(), "p/", follow.WithLogger(quiet))
	if cut.Prefix() != "p/" {
		t.Errorf("Prefix() = %q, want p/", cut.Prefix())
	}
	run(t, cut)
	waitFor(t, "a lag before the service took the watch", func() bool { return cut.Lag() > 100*time.Millisecond })
	if cut.Position() != 0 {
		t.Errorf("Position() = %d without the service, want 0", cut.Position())
	}
	// One that gives up soon: the follower records the watch's error.
	hasty, err := client.New(nowhere, client.WithRetryTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer hasty.Close()
	failing := follow.New(hasty, guard.NewMemoryStore(), "p/", follow.WithLogger(quiet))
	run(t, failing)
	waitFor(t, "the watch's error", func() bool {
		at, err := failing.LastError()
		return err != nil && strings.HasPrefix(err.Error(), "watch: ") && !at.IsZero()
	})

	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	store := guard.NewMemoryStore()
	f := follow.New(c, store, "p/", follow.WithLogger(quiet))
	run(t, f)
	waitFor(t, "a position once the service took the watch", func() bool { return f.Position() != 0 })
	start := f.Position()
	l, err := c.Grant(ctx, "p/a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Release(ctx, "p/a", l.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the closing recorded", func() bool { return store.Highest("p/a").Token == l.Token+1 })
	waitFor(t, "the position past the grant and the release", func() bool { return f.Position() >= start+2 })
	waitFor(t, "no lag", func() bool { return f.Lag() == 0 })
	if at, err := f.LastError(); err != nil {
		t.Errorf("LastError() = %v, %v; want none", at, err)
	}
}

// proxy forwards TCP connections to a backend it can be cut from.
type proxy struct {
	ln      net.Listener
	mu      sync.Mutex
	backend string
	cut     bool
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newProxy(t *testing.T, backend string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, backend: backend}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		backend, cut := p.backend, p.cut
		p.mu.Unlock()
		if cut {
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", backend)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Go(func() { io.Copy(out, in); out.Close() })
		p.wg.Go(func() { io.Copy(in, out); in.Close() })
	}
}

// setCut cuts every connection and refuses new ones, or lets them through
// again.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

func (p *proxy) setBackend(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backend = addr
}

// startServer starts a fenced in dir, as fencetest does, keeping its data
// for a restart.
func startServer(t *testing.T, dir string) *server.Server {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.DataDir, cfg.Listen, cfg.Logger, cfg.SignTokens, cfg.NoClockFloor = dir, "127.0.0.1:0", quiet, false, true
	srv, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to lead", srv.Ready)
	return srv
}

// restartCut cuts p off, closes c and srv, starts the service again in dir
// (a new term, whose leader holds none of the old term's events) and
// points p at it, still cut; it returns the new server and a client of it.
func restartCut(t *testing.T, dir string, srv *server.Server, p *proxy, c *client.Client) (*server.Server, *client.Client) {
	t.Helper()
	p.setCut(true)
	c.Close()
	srv.Close(context.Background())
	srv = startServer(t, dir)
	p.setBackend(srv.Addr())
	c, err := client.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// TestFollowResumes: cut off from the service, the follower resumes
// where it was, and gets the closing it missed from the stream; cut off
// across a restart of the service (a new term, whose leader no longer
// holds the events to resume from), it reads the state of the scopes it
// has seen instead. Neither moves a mark back.
func TestFollowResumes(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	srv := startServer(t, dir)
	defer func() { srv.Close(context.Background()) }()
	p := newProxy(t, srv.Addr())
	fc, err := client.New(p.ln.Addr().String(), client.WithRetryTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	store := guard.NewMemoryStore()
	f := follow.New(fc, store, "", follow.WithLogger(quiet))
	following(t, f)
	grant := func(c *client.Client, scope string) fence.Lease {
		t.Helper()
		l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the follower to see "+scope+"'s grant", func() bool { return store.Highest(scope).Token == l.Token })
		return l
	}
	c, err := client.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	a := grant(c, "a")
	b := grant(c, "b")

	// Cut off, the same term: the release is in the leader's ring.
	p.setCut(true)
	if _, err := c.Release(ctx, "a", a.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the follower notices the cut
	p.setCut(false)
	waitFor(t, "a's closing after the follower resumed", func() bool { return store.Highest("a").Token == a.Token+1 })
	if f.Resyncs() != 0 {
		t.Errorf("%d resyncs for a cut within a term; want the watch resumed", f.Resyncs())
	}

	// Cut off across a restart: the new term's leader has no events of
	// the old one. b is released before the follower is back.
	srv, c = restartCut(t, dir, srv, p, c)
	if _, err := c.Release(ctx, "b", b.ID); err != nil {
		t.Fatal(err)
	}
	if err := write(store, "a", 50); err != nil { // another writer, far ahead
		t.Fatal(err)
	}
	p.setCut(false)
	waitFor(t, "b's closing, read from the state", func() bool { return store.Highest("b").Token == b.Token+1 })
	if f.Resyncs() == 0 {
		t.Error("no resync after a restart of the service")
	}
	if got := store.Highest("a").Token; got != 50 {
		t.Errorf("a's mark after the resync = %d, want 50 kept", got)
	}
	// And it follows the new term's stream.
	grant(c, "c")
}

func init() {
	// The servers' goroutines log nothing the tests read.
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
}

// TestFollowStartsAfterAnEnd: a lease ends while no follower runs. A
// follower started afterwards over a store that names its scopes (a
// guard.Lister: boltguard) closes it; over a store that cannot name them,
// it stays open until the scope's next event.
func TestFollowStartsAfterAnEnd(t *testing.T) {
	ctx := testContext(t)
	srv := fencetest.NewServer()
	defer srv.Close()
	c := srv.Client()
	defer c.Close()
	open := func(name string) *boltguard.Store {
		s, err := boltguard.Open(t.TempDir() + "/" + name + ".db")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	listing, hidden := open("listing"), open("hidden")
	highest := func(s *boltguard.Store, scope string) uint64 {
		m, err := s.Highest(scope)
		if err != nil {
			t.Fatal(err)
		}
		return m.Token
	}
	const scope = "orders/ended"
	l, err := c.Grant(ctx, scope, client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []guard.Store{listing, hidden} {
		if err := write(s, scope, l.Token); err != nil {
			t.Fatalf("the holder's write: %v", err)
		}
	}
	// A mark under the prefix that no token could have made, such as a
	// row written by hand: the follower skips it.
	if err := listing.Update(ctx, "orders/ bad", guard.Write{Token: fence.Token{Scope: "orders/ bad", Value: 1}}, false, func(*bbolt.Tx) error { return nil }); err != nil {
		t.Fatalf("the stray mark: %v", err)
	}
	if _, err := c.Release(ctx, scope, l.ID); err != nil {
		t.Fatal(err)
	}

	// struct{ guard.Store } has Fence only: not a Lister.
	lf := follow.New(c, listing, "orders/", follow.WithLogger(quiet))
	following(t, lf)
	following(t, follow.New(c, struct{ guard.Store }{hidden}, "orders/", follow.WithLogger(quiet)))
	waitFor(t, "the follower to close the lease that ended before it started", func() bool {
		return highest(listing, scope) == l.Token+1
	})
	// An event after both started, which both followers record.
	next, err := c.Grant(ctx, "orders/sentinel")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both followers to record a later grant", func() bool {
		return highest(listing, "orders/sentinel") == next.Token && highest(hidden, "orders/sentinel") == next.Token
	})
	// Caught up: the state read at the start is done, stray mark and all.
	waitFor(t, "the listing follower to catch up", func() bool { return lf.Lag() == 0 && lf.Position() != 0 })
	if got := highest(hidden, scope); got != l.Token {
		t.Errorf("the store that names no scope has mark %d for the ended lease, want %d: still open", got, l.Token)
	}
	if err := write(listing, scope, l.Token); !errors.Is(err, fence.ErrStale) {
		t.Errorf("late write over the listing store = %v, want stale", err)
	}
}

// counting is an HTTP transport that counts the Get calls answered.
type counting struct {
	http.RoundTripper
	gets atomic.Int64
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := c.RoundTripper.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusOK && r.URL.Path == fencev1connect.LeaseServiceGetProcedure {
		c.gets.Add(1)
	}
	return resp, err
}

// TestFollowForgetsEndedLeases: a long-lived follower over many
// short-lived scopes (one per job) remembers the leases held, not every
// scope it saw: once a lease's closing is recorded and the scope is free,
// it forgets the scope. Across a restart of the service (events missed,
// the state read again), it reads the leases it knew held, not every
// scope it ever saw, and still closes the one that ended meanwhile.
func TestFollowForgetsEndedLeases(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	srv := startServer(t, dir)
	defer func() { srv.Close(context.Background()) }()
	p := newProxy(t, srv.Addr())
	tr := &counting{RoundTripper: http.DefaultTransport.(*http.Transport).Clone()}
	defer tr.RoundTripper.(*http.Transport).CloseIdleConnections()
	fc, err := client.New(p.ln.Addr().String(), client.WithRetryTimeout(500*time.Millisecond), client.WithHTTPClient(&http.Client{Transport: tr}))
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	store := guard.NewMemoryStore()
	f := follow.New(fc, store, "job/", follow.WithLogger(quiet))
	following(t, f)
	c, err := client.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // restartCut closes it too; a second Close does nothing

	// Three leases stay held; 2,000 jobs each take a scope of their own
	// and release it, 16 at a time.
	const held, jobs = 3, 2000
	var kept []fence.Lease
	for i := range held {
		l, err := c.Grant(ctx, fmt.Sprintf("job/held-%d", i), client.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, l)
	}
	tokens := make([]uint64, jobs)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range jobs {
		g.Go(func() error {
			scope := fmt.Sprintf("job/%d", i)
			l, err := c.Grant(gctx, scope, client.WithTTL(time.Minute))
			if err != nil {
				return err
			}
			tokens[i] = l.Token
			_, err = c.Release(gctx, scope, l.ID)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every job's closing recorded", func() bool {
		for i, tok := range tokens {
			if store.Highest(fmt.Sprintf("job/%d", i)).Token != tok+1 {
				return false
			}
		}
		return true
	})
	waitFor(t, fmt.Sprintf("the follower to remember the %d held leases only", held), func() bool { return f.Remembered() == held })

	// Cut off across a restart: the new term's leader has no events of
	// the old one. A held lease is released meanwhile.
	srv, c = restartCut(t, dir, srv, p, c)
	if _, err := c.Release(ctx, "job/held-0", kept[0].ID); err != nil {
		t.Fatal(err)
	}
	tr.gets.Store(0)
	p.setCut(false)
	waitFor(t, "the released lease's closing, read from the state", func() bool { return store.Highest("job/held-0").Token == kept[0].Token+1 })
	waitFor(t, "the follower caught up after its resync", func() bool { return f.Resyncs() > 0 && f.Position() != 0 && f.Lag() == 0 })
	// Each read of the state (a failed one too) reads the leases it knew
	// held, at most: not the 2,000 scopes of the jobs.
	if gets, resyncs := tr.gets.Load(), f.Resyncs(); gets > int64(held)*int64(resyncs) {
		t.Errorf("%d Gets in %d resyncs; want at most %d each, the leases known held, not one per scope ever seen", gets, resyncs, held)
	}
	waitFor(t, fmt.Sprintf("the follower to remember the %d leases still held", held-1), func() bool { return f.Remembered() == held-1 })
}
