package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence/client"
	"github.com/fence-dev/fence/internal/scrape"
)

// TestGuardFollow (invariant 9 at the in-database guards): with `fencectl
// guard follow` running, a lease that is released or expires has its late
// write refused by the function guard install put in PostgreSQL, MySQL or
// Redis before anyone else wrote; in a scope no follower covers, the same
// late write is accepted. Writers call the installed functions, as a
// writer in any language would.
func TestGuardFollow(t *testing.T) {
	s := startFenced(t)
	c, err := client.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := fmt.Sprintf("fencectl_follow_%08x", rand.Uint32())

	// scenario returns whether the old holder's late write was accepted
	// (followScenario), failing the test if it was refused other than as
	// stale.
	scenario := func(t *testing.T, scope, end string, write func(scope string, token uint64) error) (lateAccepted bool) {
		t.Helper()
		_, err := followScenario(t, c, scope, end, write)
		if err != nil && strings.HasPrefix(scope, "followed/") &&
			!strings.Contains(err.Error(), "FN409") && !strings.Contains(err.Error(), "STALE") && !strings.Contains(err.Error(), "1644") {
			t.Fatalf("%s: late write: %v, want refused as stale", scope, err)
		}
		return err == nil
	}

	check := func(t *testing.T, u string, write func(scope string, token uint64) error) {
		t.Helper()
		if code, _, stderr := ctl("guard", "install", u); code != exitOK {
			t.Fatalf("install: %d %s", code, stderr)
		}
		startGuardFollow(t, s, u, "followed/")
		for _, end := range []string{"released", "expired"} {
			if scenario(t, "followed/"+name+"/"+end, end, write) {
				t.Errorf("%s with a follower: the late write was accepted", end)
			}
			if !scenario(t, "unfollowed/"+name+"/"+end, end, write) {
				t.Errorf("%s without a follower: the late write was refused; want accepted (the window the follower closes)", end)
			}
		}
	}

	t.Run("postgres", func(t *testing.T) {
		admin, u := postgresSchema(t, name)
		check(t, u.String(), func(scope string, token uint64) error {
			_, err := admin.Exec("SELECT "+name+".fence_advance($1, $2::bigint)", scope, int64(token))
			return err
		})
	})
	t.Run("mysql", func(t *testing.T) {
		admin, _, u := mysqlDatabase(t, name)
		check(t, u, func(scope string, token uint64) error {
			_, err := admin.Exec("CALL "+name+".fence_advance(?, ?, 0)", scope, token)
			return err
		})
	})
	t.Run("redis", func(t *testing.T) {
		u := redisServer(t)
		opt, _ := redis.ParseURL(u)
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		check(t, u, func(scope string, token uint64) error {
			mark, key := "fence:{"+scope+"}", "{"+scope+"}:value"
			t.Cleanup(func() { rdb.Del(context.Background(), mark, key) })
			return rdb.FCall(context.Background(), "fence_set", []string{mark, key}, token, 0, "v").Err()
		})
	})
}

// followScenario runs a lease's life under scope on c, with write the
// guarded write of one store (nil error: accepted): the holder writes, the
// lease is released or expires (end), its closing token is recorded at the
// service, and then the old holder writes again. Under "followed/" that
// late write is retried, the follower's delay, until it is refused (for
// 20 s at most); a retry that is accepted changes nothing, its token being
// the mark already. It returns the lease's token and the late write's last
// error, nil if it was accepted.
func followScenario(t *testing.T, c *client.Client, scope, end string, write func(scope string, token uint64) error) (uint64, error) {
	t.Helper()
	ctx := context.Background()
	ttl := time.Minute
	if end == "expired" {
		// Long enough for the holder's write to land before the
		// follower closes the token, even on a busy machine.
		ttl = time.Second
	}
	l, err := c.Grant(ctx, scope, client.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if err := write(scope, l.Token); err != nil {
		t.Fatalf("%s: the holder's write: %v", scope, err)
	}
	if end == "released" {
		if _, err := c.Release(ctx, scope, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	var closing uint64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := c.Get(ctx, scope)
		if err == nil && st.Lease == nil {
			closing = st.LastToken
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the lease did not end", scope)
		}
	}
	if closing != l.Token+1 {
		t.Fatalf("%s: last token %d after the end of token %d, want its closing %d", scope, closing, l.Token, l.Token+1)
	}
	err = write(scope, l.Token)
	if strings.HasPrefix(scope, "followed/") {
		for deadline := time.Now().Add(20 * time.Second); err == nil && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			err = write(scope, l.Token)
		}
	}
	return l.Token, err
}

// startGuardFollow starts `fencectl guard follow u --prefix prefix -o
// json` (with extra flags) against s until the test ends, and returns its
// first line.
func startGuardFollow(t *testing.T, s *fenced, u, prefix string, extra ...string) guardFollowJSON {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := s.command(ctx, append([]string{"guard", "follow", u, "--prefix", prefix, "--report", "1h", "-o", "json"}, extra...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("guard follow's stderr:\n%s", stderr.String())
		}
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("guard follow printed nothing: %s", stderr.String())
	}
	var first guardFollowJSON
	// 64-bit counts and the lag are strings, as in the API's JSON.
	if err := json.Unmarshal(lines.Bytes(), &first); err != nil || first.Prefix != prefix || strings.Contains(lines.Text(), ":fence@") ||
		!strings.Contains(lines.Text(), `"advanced":"`) || !strings.Contains(lines.Text(), `"lag":"`) {
		t.Fatalf("guard follow's first line %q: %v", lines.Text(), err)
	}
	return first
}

// TestGuardFollowListen: `fencectl guard follow --listen` serves the
// follower's progress. Started before its fenced answers, it reports a
// growing lag, watch position 0 and the watch's error, on /metrics and on
// its status page; once fenced is up, the position moves, the marks
// advanced count a grant and a release, and the lag is back to 0.
func TestGuardFollowListen(t *testing.T) {
	u := redisServer(t)
	addr := freeAddr(t) // the fenced, started later
	prefix := fmt.Sprintf("listen%08x/", rand.Uint32())
	first := startGuardFollow(t, &fenced{addr: addr}, u, prefix, "--listen", "127.0.0.1:0")
	if first.Listen == "" || strings.HasSuffix(first.Listen, ":0") {
		t.Fatalf("guard follow's first line %+v: want the address it listens on", first)
	}
	metric := func(name string) float64 {
		t.Helper()
		v, ok := scrape.Find(scrape.Families(t, first.Listen), name, "prefix", prefix)
		if !ok {
			t.Fatalf("/metrics has no %s{prefix=%q}", name, prefix)
		}
		return v
	}
	status := func() string {
		t.Helper()
		resp, err := http.Get("http://" + first.Listen + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /: %s %s", resp.Status, b)
		}
		return string(b)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30s\nstatus page:\n%s", what, status())
			}
		}
	}

	// No service yet: behind since it started, and saying why.
	waitFor("a lag without the service", func() bool { return metric("fence_follow_lag_seconds") > 0.3 })
	if pos := metric("fence_follow_watch_position"); pos != 0 {
		t.Errorf("fence_follow_watch_position = %v without the service, want 0", pos)
	}
	waitFor("the watch's error on the status page", func() bool { return strings.Contains(status(), "watch: ") })
	page := status()
	for _, want := range []string{fmt.Sprintf("prefix          %q", prefix), "service         " + addr, "store           " + u, "NOT following"} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page lacks %q:\n%s", want, page)
		}
	}

	s := startFenced(t, "--listen", addr)
	waitFor("a watch position once fenced is up", func() bool { return metric("fence_follow_watch_position") > 0 })
	waitFor("no lag once following", func() bool { return metric("fence_follow_lag_seconds") == 0 })
	pos, advanced := metric("fence_follow_watch_position"), metric("fence_follow_marks_advanced_total")

	c, err := client.New(s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opt, _ := redis.ParseURL(u)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	scope := prefix + "a"
	t.Cleanup(func() { rdb.Del(context.Background(), "fence:{"+scope+"}") })
	mark := func() uint64 {
		v, _ := rdb.HGet(context.Background(), "fence:{"+scope+"}", "token").Uint64()
		return v
	}
	l, err := c.Grant(context.Background(), scope, client.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the grant's mark", func() bool { return mark() == l.Token })
	waitFor("the grant counted", func() bool {
		return metric("fence_follow_marks_advanced_total") > advanced && metric("fence_follow_watch_position") > pos
	})
	pos, advanced = metric("fence_follow_watch_position"), metric("fence_follow_marks_advanced_total")
	if _, err := c.Release(context.Background(), scope, l.ID); err != nil {
		t.Fatal(err)
	}
	waitFor("the closing's mark", func() bool { return mark() == l.Token+1 })
	waitFor("the release counted", func() bool {
		return metric("fence_follow_marks_advanced_total") > advanced && metric("fence_follow_watch_position") > pos
	})
	// The follower counts an advance as soon as the store took it, and
	// drops the mark from its lag just after: wait for that too.
	waitFor("no lag once the closing is recorded", func() bool { return metric("fence_follow_lag_seconds") == 0 })
	if n := metric("fence_follow_resyncs_total"); n > 1 {
		// Its watch never started before fenced was up: what it could
		// have missed is read from the state, once at the most (a store
		// that lists its scopes may count that first read or not).
		t.Errorf("fence_follow_resyncs_total = %v, want at most 1", n)
	}
	page = status()
	for _, want := range []string{"state           following\n", fmt.Sprintf("marks advanced  %d\n", int(metric("fence_follow_marks_advanced_total"))), fmt.Sprintf("watch position  %d\n", int(metric("fence_follow_watch_position")))} {
		if !strings.Contains(page, want) {
			t.Errorf("the status page lacks %q:\n%s", want, page)
		}
	}
}

// TestGuardFollowHelp: guard follow's help documents --listen and the
// names of the metrics it serves.
func TestGuardFollowHelp(t *testing.T) {
	t.Parallel()
	r := (&fenced{addr: "127.0.0.1:1"}).want(t, exitOK, "guard", "follow", "--help")
	for _, want := range []string{"--listen", "/metrics", "status page", "fence_follow_lag_seconds", "fence_follow_marks_advanced_total", "fence_follow_resyncs_total", "fence_follow_watch_position"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("guard follow --help lacks %q:\n%s", want, r.stdout)
		}
	}
}
