package redisguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/redisguard"
)

// TestMalformedTokensLeaveTheMark presents tokens no service issues to
// every fenced command of a Guard. Each is refused as invalid before the
// script runs: the mark and the data stay as they were.
func TestMalformedTokensLeaveTheMark(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	accept(t, g, wr(sc, 5, 2))
	key := redisguard.Key(sc, "v")
	for _, w := range []guard.Write{
		wr(sc, 0, 0), wr(sc, 0, 1<<64-1), wr(sc, fence.MaxToken+1, 0), wr(sc, 1<<64-1, 0), wr("", fence.MaxToken, 0),
	} {
		for name, write := range map[string]func() error{
			"set":    func() error { return set(g, w) },
			"del":    func() error { _, err := g.Del(ctx, w, key); return err },
			"hset":   func() error { _, err := g.HSet(ctx, w, redisguard.Key(sc, "h"), "f", "x"); return err },
			"incrby": func() error { _, err := g.IncrBy(ctx, w, redisguard.Key(sc, "n"), 1); return err },
			"eval": func() error {
				_, err := g.Eval(ctx, w, `return redis.call('SET', KEYS[1], 'evil')`, []string{key})
				return err
			},
		} {
			if err := write(); !errors.Is(err, fence.ErrInvalid) {
				t.Errorf("%s with token %d seq %d of %q: %v, want ErrInvalid", name, w.Token.Value, w.Seq, w.Token.Scope, err)
			}
		}
	}
	if m, err := g.Highest(ctx, sc); err != nil || m != (guard.Mark{Token: 5, Seq: 2}) {
		t.Errorf("mark %+v, %v; want token 5 sequence 2", m, err)
	}
	if v, err := rdb.Get(ctx, key).Result(); err != nil || v != "5/2" {
		t.Errorf("data %q, %v; want the write of token 5", v, err)
	}
	if n, _ := rdb.Exists(ctx, redisguard.Key(sc, "h"), redisguard.Key(sc, "n")).Result(); n != 0 {
		t.Errorf("%d refused writes left keys behind", n)
	}
}

// TestStoreTokensBeyondFloat is TestTokensBeyondFloat for Store, whose
// check and advance are separate scripts: tokens a double cannot tell
// apart are ordered exactly, and the mark advances to the exact value.
func TestStoreTokensBeyondFloat(t *testing.T) {
	rdb := testRedis(t)
	s := redisguard.NewStore(rdb)
	const p53 = uint64(1) << 53
	noop := func(context.Context) error { return nil }
	for _, c := range []struct {
		name         string
		older, newer uint64
	}{
		{"2^53 then 2^53+1", p53, p53 + 1},
		{"2^63-2 then 2^63-1", fence.MaxToken - 1, fence.MaxToken},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := newScope(t, rdb)
			for _, v := range []uint64{c.older, c.newer} {
				if err := s.Fence(ctx, wr(sc, v, 0), false, noop); err != nil {
					t.Fatalf("token %d: %v", v, err)
				}
				if m, err := s.Highest(ctx, sc); err != nil || m.Token != v {
					t.Fatalf("after token %d the mark is %d, %v; want it exactly", v, m.Token, err)
				}
			}
			applied := false
			err := s.Fence(ctx, wr(sc, c.older, 0), false, func(context.Context) error { applied = true; return nil })
			var stale *guard.StaleError
			if applied || !errors.As(err, &stale) || stale.Highest != c.newer {
				t.Fatalf("token %d after %d: applied %v, err %v; want stale against %d", c.older, c.newer, applied, err, c.newer)
			}
		})
	}
}

// TestAnotherScopesKeyIsRefused: a token of one scope cannot write a key
// tagged with another scope, however genuine and new it is.
func TestAnotherScopesKeyIsRefused(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	mine, other := newScope(t, rdb), newScope(t, rdb)
	key := redisguard.Key(mine, "v")
	w := wr(other, 99, 0)
	for name, write := range map[string]func() error{
		"set":    func() error { return g.Set(ctx, w, key, "evil", 0) },
		"del":    func() error { _, err := g.Del(ctx, w, key); return err },
		"hset":   func() error { _, err := g.HSet(ctx, w, redisguard.Key(mine, "h"), "f", "x"); return err },
		"incrby": func() error { _, err := g.IncrBy(ctx, w, redisguard.Key(mine, "n"), 1); return err },
		"eval": func() error {
			_, err := g.Eval(ctx, w, `return redis.call('SET', KEYS[1], 'evil')`, []string{key})
			return err
		},
	} {
		if err := write(); !errors.Is(err, guard.ErrWrongScope) {
			t.Errorf("%s of %q with a token of %q: %v, want ErrWrongScope", name, key, other, err)
		}
	}
	if n, _ := rdb.Exists(ctx, key, redisguard.Key(mine, "h"), redisguard.Key(mine, "n")).Result(); n != 0 {
		t.Errorf("%d refused writes left keys behind", n)
	}
	for _, sc := range []string{mine, other} {
		if m, err := g.Highest(ctx, sc); err != nil || m != (guard.Mark{}) {
			t.Errorf("mark of %q %+v, %v; want none", sc, m, err)
		}
	}
}

// writes are the Guard's fenced commands, each writing key (the hash and
// counter commands a key of their own beside it).
func writes(g *redisguard.Guard, w guard.Write, key string) map[string]func() error {
	return map[string]func() error{
		"set":    func() error { return g.Set(ctx, w, key, "evil", 0) },
		"del":    func() error { _, err := g.Del(ctx, w, key); return err },
		"hset":   func() error { _, err := g.HSet(ctx, w, key+"-h", "f", "x"); return err },
		"incrby": func() error { _, err := g.IncrBy(ctx, w, key+"-n", 1); return err },
		"eval": func() error {
			_, err := g.Eval(ctx, w, `return redis.call('SET', KEYS[1], 'evil')`, []string{key})
			return err
		},
	}
}

// TestUntaggedKeyIsRefused: a key without a hash tag belongs to no scope,
// so no token may write it, on a single Redis as in a cluster. The error
// says which keys the token may write; nothing is written and the mark
// does not move.
func TestUntaggedKeyIsRefused(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	key := "untagged-" + sc
	t.Cleanup(func() { rdb.Del(context.Background(), key, key+"-h", key+"-n") })
	for name, write := range writes(g, wr(sc, 7, 0), key) {
		err := write()
		if !errors.Is(err, guard.ErrWrongScope) || !strings.Contains(err.Error(), "{"+sc+"}") {
			t.Errorf("%s of %q: %v, want ErrWrongScope naming the tag {%s}", name, key, err, sc)
		}
	}
	if n, _ := rdb.Exists(ctx, key, key+"-h", key+"-n").Result(); n != 0 {
		t.Errorf("%d refused writes left keys behind", n)
	}
	if m, err := g.Highest(ctx, sc); err != nil || m != (guard.Mark{}) {
		t.Errorf("mark of %q %+v, %v; want none", sc, m, err)
	}
}

// TestMarkKeyIsRefused: the mark key carries its scope's tag, but no
// write, even with a current token of that scope, may overwrite or delete
// it: a deleted mark would let every older token write again.
func TestMarkKeyIsRefused(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	if err := g.Set(ctx, wr(sc, 5, 0), redisguard.Key(sc, "v"), "v5", 0); err != nil {
		t.Fatal(err)
	}
	for name, write := range writes(g, wr(sc, 6, 0), g.MarkKey(sc)) {
		if name == "hset" || name == "incrby" {
			continue // their keys are beside the mark's
		}
		if err := write(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s of the mark key %q: %v, want an invalid-argument error", name, g.MarkKey(sc), err)
		}
	}
	if m, err := g.Highest(ctx, sc); err != nil || m != (guard.Mark{Token: 5}) {
		t.Errorf("mark of %q %+v, %v; want token 5", sc, m, err)
	}
}

// TestKeyScope: with WithKeyScope the Guard asks which scope a key
// belongs to instead of reading its tag: a token writes the keys given to
// its scope, tagged or not, and is refused the others.
func TestKeyScope(t *testing.T) {
	rdb := testRedis(t)
	mine, other := newScope(t, rdb), newScope(t, rdb)
	owner := map[string]string{"legacy-a-" + mine: mine, "legacy-b-" + mine: other}
	g := redisguard.New(rdb, redisguard.WithKeyScope(func(key string) string { return owner[key] }))
	t.Cleanup(func() { rdb.Del(context.Background(), "legacy-a-"+mine, "legacy-b-"+mine) })
	if err := g.Set(ctx, wr(mine, 3, 0), "legacy-a-"+mine, "v", 0); err != nil {
		t.Errorf("a key given to the token's scope: %v", err)
	}
	err := g.Set(ctx, wr(mine, 3, 0), "legacy-b-"+mine, "v", 0)
	if !errors.Is(err, guard.ErrWrongScope) || !strings.Contains(err.Error(), "WithKeyScope") {
		t.Errorf("a key given to another scope: %v, want ErrWrongScope naming WithKeyScope", err)
	}
	if n, _ := rdb.Exists(ctx, "legacy-b-"+mine).Result(); n != 0 {
		t.Error("the refused write left its key behind")
	}
}
