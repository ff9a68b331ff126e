package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence/client"
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

	// follow starts guard follow on u for followed/ and waits for its
	// first line.
	follow := func(t *testing.T, u string) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		cmd := s.command(ctx, "guard", "follow", u, "--prefix", "followed/", "--report", "1h", "-o", "json")
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
		if err := json.Unmarshal(lines.Bytes(), &first); err != nil || first.Prefix != "followed/" || strings.Contains(lines.Text(), ":fence@") {
			t.Fatalf("guard follow's first line %q: %v", lines.Text(), err)
		}
	}

	// scenario runs a lease's life under scope with write, the guarded
	// write of one of the installed functions (nil error: accepted), and
	// returns whether the old holder's late write was accepted.
	scenario := func(t *testing.T, scope, end string, write func(scope string, token uint64) error) (lateAccepted bool) {
		t.Helper()
		ctx := context.Background()
		ttl := time.Minute
		if end == "expired" {
			ttl = 100 * time.Millisecond
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
		if strings.HasPrefix(scope, "followed/") {
			// Poll with the late write itself until it is refused: the
			// follower's delay. Each try that is accepted changes
			// nothing, its token being the mark already.
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if err := write(scope, l.Token); err != nil {
					if !strings.Contains(err.Error(), "FN409") && !strings.Contains(err.Error(), "STALE") && !strings.Contains(err.Error(), "1644") {
						t.Fatalf("%s: late write: %v, want refused as stale", scope, err)
					}
					return false
				}
			}
			return true
		}
		return write(scope, l.Token) == nil
	}

	check := func(t *testing.T, u string, write func(scope string, token uint64) error) {
		t.Helper()
		if code, _, stderr := ctl("guard", "install", u); code != exitOK {
			t.Fatalf("install: %d %s", code, stderr)
		}
		follow(t, u)
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
