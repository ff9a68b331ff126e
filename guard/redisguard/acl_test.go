package redisguard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence/guard/redisguard"
)

// TestACLRecipe applies docs/security.md's ACL rules ("Who may move a
// mark") to users of a scope prefix of the test's own: a writer (FCALL and
// Go's Guard), a follower (FCALL fence_advance and Go's Store, as
// `fencectl guard follow` uses it) and a user that may read every key. The
// functions check no signature, so a user that could call them, or write
// a mark, could lock every holder of a scope out with 2^63-1: the reader
// is refused both, and the writer and the follower are refused both on
// scopes outside their prefix, while their own calls work.
func TestACLRecipe(t *testing.T) {
	url := testRedisURL(t) // loads the library
	admin := testRedis(t)
	base := newScope(t, admin)
	prefix := base + "/orders/"
	mine, theirs := prefix+"a", base+"/billing/a"
	const lockout = "9223372036854775807"
	if err := admin.Do(ctx, "FCALL", "fence_advance", 1, "fence:{"+theirs+"}", 5, 0).Err(); err != nil {
		t.Fatal(err)
	}

	suffix := fmt.Sprintf("%08x", rand.Uint32())
	password := "pw-" + suffix
	// The recipe: the commands the functions and redisguard's scripts run
	// under their caller's ACL, on the keys of the prefix's scopes alone.
	users := map[string][]string{
		"writer": {"~fence:{" + prefix + "*}", "~{" + prefix + "*}:*",
			"+fcall", "+evalsha", "+eval", "+hmget", "+hset", "+set", "+del", "+incrby", "+get"},
		"follower": {"~fence:{" + prefix + "*}", "+fcall", "+evalsha", "+eval", "+hmget", "+hset", "+scan", "+ping"},
		"reader":   {"%R~*", "+@read"},
	}
	as := map[string]*redis.Client{}
	for role, rules := range users {
		name := "fence-test-" + role + "-" + suffix
		args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password}
		for _, r := range rules {
			args = append(args, r)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := admin.Do(context.Background(), "ACL", "DELUSER", name).Err(); err != nil {
				t.Errorf("delete user %s: %v", name, err)
			}
		})
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		opt.Username, opt.Password = name, password
		as[role] = redis.NewClient(opt)
		t.Cleanup(func() { as[role].Close() })
	}
	fcall := func(rdb *redis.Client, fn string, keys []string, args ...any) error {
		a := []any{"FCALL", fn, len(keys)}
		for _, k := range keys {
			a = append(a, k)
		}
		return rdb.Do(ctx, append(a, args...)...).Err()
	}
	ok := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.HasPrefix(err.Error(), "NOPERM") {
			t.Fatalf("%s: %v, want refused (NOPERM)", what, err)
		}
	}
	mark := func(scope string) string {
		t.Helper()
		v, err := admin.HGet(ctx, "fence:{"+scope+"}", "token").Result()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	w := as["writer"]
	ok("the writer's fence_set", fcall(w, "fence_set", []string{"fence:{" + mine + "}", redisguard.Key(mine, "v")}, 1, 0, "x"))
	ok("the writer's fence_advance", fcall(w, "fence_advance", []string{"fence:{" + mine + "}"}, 2, 0))
	ok("the writer's Guard.Set", redisguard.New(w).Set(ctx, wr(mine, 3, 0), redisguard.Key(mine, "v"), "y", 0))
	refused("the writer's fence_advance of another prefix", fcall(w, "fence_advance", []string{"fence:{" + theirs + "}"}, lockout, 0))
	refused("the writer's HSET of another prefix's mark", w.HSet(ctx, "fence:{"+theirs+"}", "token", lockout).Err())

	f := as["follower"]
	store := redisguard.NewStore(f)
	ok("the follower's PING", f.Ping(ctx).Err())
	ok("the follower's Store.Fence", store.Fence(ctx, wr(mine, 4, 0), false, func(context.Context) error { return nil }))
	scopes, err := store.Scopes(ctx, prefix)
	ok("the follower's Store.Scopes", err)
	if !slices.Equal(scopes, []string{mine}) {
		t.Fatalf("the follower lists %q under %s, want %q", scopes, prefix, mine)
	}
	ok("the follower's fence_advance", fcall(f, "fence_advance", []string{"fence:{" + mine + "}"}, 5, 0))
	refused("the follower's fence_set", fcall(f, "fence_set", []string{"fence:{" + mine + "}", redisguard.Key(mine, "v")}, 6, 0, "z"))
	refused("the follower's fence_advance of another prefix", fcall(f, "fence_advance", []string{"fence:{" + theirs + "}"}, lockout, 0))

	r := as["reader"]
	if v, err := r.HGet(ctx, "fence:{"+mine+"}", "token").Result(); err != nil || v != "5" {
		t.Fatalf("the reader reads the mark %q, %v; want 5", v, err)
	}
	refused("the reader's fence_advance", fcall(r, "fence_advance", []string{"fence:{" + mine + "}"}, lockout, 0))
	refused("the reader's HSET of the mark", r.HSet(ctx, "fence:{"+mine+"}", "token", lockout).Err())
	refused("the reader's EVAL", r.Eval(ctx, "return redis.call('HSET', KEYS[1], 'token', ARGV[1])", []string{"fence:{" + mine + "}"}, lockout).Err())

	if m := mark(mine); m != "5" {
		t.Fatalf("the mark of %s is %s, want 5, the follower's", mine, m)
	}
	if m := mark(theirs); m != "5" {
		t.Fatalf("the mark of %s is %s, want 5, as the test set it", theirs, m)
	}
}
