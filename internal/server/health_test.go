package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/fencetest"
	"github.com/fence-dev/fence/internal/scrape"
	"github.com/fence-dev/fence/internal/server"
)

// startNode starts a server of a cluster on loopback, with a Raft address,
// and stops it at the end of the test.
func startNode(t testing.TB, id string, join ...string) *server.Server {
	t.Helper()
	return startNodeConfig(t, nodeConfig(id, join...))
}

// nodeConfig is startNode's configuration, for a test to change first;
// startNodeConfig gives it a data directory, unless the test names one.
func nodeConfig(id string, join ...string) server.Config {
	cfg := server.DefaultConfig()
	cfg.NodeID = id
	cfg.DataDir = "" // startNodeConfig makes one, unless the test names one first
	cfg.Listen = "127.0.0.1:0"
	cfg.RaftListen = "127.0.0.1:0"
	cfg.Bootstrap = len(join) == 0
	cfg.Join = join
	// Generous, so that a loaded test machine (-race, browsers) does not
	// move the leadership under the tests' feet.
	cfg.ElectionTimeout = 4 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	// Tokens count from 1, so tests and pages can name them; the floor is
	// TestTokenFloor's.
	cfg.NoClockFloor = true
	return cfg
}

// startNodeConfig starts a server of cfg, in a new data directory unless
// cfg names one (a restart's), and stops it at the end of the test.
func startNodeConfig(t testing.TB, cfg server.Config) *server.Server {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := server.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Close(ctx)
	})
	return s
}

// newClient returns a client of addrs (one address, or a comma-separated
// list), closed at the end of the test.
func newClient(t testing.TB, addrs string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startPair starts a two-node cluster and returns its leader and its
// follower once the follower is ready to forward to the leader.
func startPair(ctx context.Context, t testing.TB) (leader, follower *server.Server) {
	t.Helper()
	leader = startNode(t, "n1")
	await(ctx, t, "n1 leads", func() bool { return leader.Ready() })
	follower = startNode(t, "n2", leader.Addr())
	await(ctx, t, "n2 follows", func() bool {
		code, _ := get(t, follower.Addr(), "/readyz")
		return code == http.StatusOK
	})
	return leader, follower
}

// await polls cond until it holds, failing the test when ctx ends first.
func await(ctx context.Context, t testing.TB, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// get fetches a path and returns the status code and body.
func get(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

func TestHealthSingleNode(t *testing.T) {
	srv := fencetest.NewServer()
	defer srv.Close()
	if code, body := get(t, srv.Addr, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, srv.Addr, "/readyz"); code != http.StatusOK || !strings.HasPrefix(body, "ready: leader n1") {
		t.Errorf("/readyz = %d %q, want 200 ready: leader n1", code, body)
	}
}

// TestHealthNoLeader: a node waiting to be added to a cluster is alive but
// not ready, and says why.
func TestHealthNoLeader(t *testing.T) {
	n := startNode(t, "lonely", "127.0.0.1:1") // nobody answers there
	if code, _ := get(t, n.Addr(), "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	code, body := get(t, n.Addr(), "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no leader known") {
		t.Errorf("/readyz = %d %q, want 503 naming no leader", code, body)
	}
}

// TestHealthFollower: a follower answers /readyz, /healthz and /metrics
// itself rather than forwarding them to the leader.
func TestHealthFollower(t *testing.T) {
	ctx := testContext(t)
	leader, follower := startPair(ctx, t)
	code, body := get(t, follower.Addr(), "/readyz")
	if code != http.StatusOK || !strings.HasPrefix(body, "ready: follower of n1") {
		t.Errorf("follower /readyz = %d %q, want 200 ready: follower of n1", code, body)
	}
	if got, _ := scrape.Find(scrape.Families(t, follower.Addr()), "fence_raft_leader"); got != 0 {
		t.Errorf("follower's fence_raft_leader = %v, want 0: its own, not the leader's", got)
	}
	if got, _ := scrape.Find(scrape.Families(t, leader.Addr()), "fence_raft_leader"); got != 1 {
		t.Errorf("leader's fence_raft_leader = %v, want 1", got)
	}
}
