package redisguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/redisguard"
)

var ctx = context.Background()

func wr(scope string, token, seq uint64) guard.Write {
	return guard.Write{Token: fence.Token{Scope: scope, Value: token}, Seq: seq}
}

// TestConformance runs guardtest on Store, against a redis-server of its
// own so that Reopen can restart it.
func TestConformance(t *testing.T) {
	srv := startServer(t)
	guardtest.Run(t, guardtest.Harness{
		Open: func(t *testing.T) guard.Store { return redisguard.NewStore(srv.client(t)) },
		Reopen: func(t *testing.T, _ guard.Store) guard.Store {
			srv.restart(t)
			return redisguard.NewStore(srv.client(t))
		},
	})
}

// set is a fenced SET of the token's value to the scope's "v" key.
func set(g *redisguard.Guard, w guard.Write) error {
	return g.Set(ctx, w, redisguard.Key(w.Token.Scope, "v"), strconv.FormatUint(w.Token.Value, 10)+"/"+strconv.FormatUint(w.Seq, 10), 0)
}

func accept(t *testing.T, g *redisguard.Guard, w guard.Write) {
	t.Helper()
	if err := set(g, w); err != nil {
		t.Fatalf("write token %d seq %d: %v, want accepted", w.Token.Value, w.Seq, err)
	}
}

func refuse(t *testing.T, rdb redis.UniversalClient, g *redisguard.Guard, w guard.Write, highest, highestSeq uint64) {
	t.Helper()
	key := redisguard.Key(w.Token.Scope, "v")
	before, _ := rdb.Get(ctx, key).Result()
	err := set(g, w)
	var stale *guard.StaleError
	if !errors.As(err, &stale) || !errors.Is(err, fence.ErrStale) {
		t.Fatalf("write token %d seq %d: %v, want a StaleError", w.Token.Value, w.Seq, err)
	}
	want := guard.StaleError{Scope: w.Token.Scope, Presented: w.Token.Value, Highest: highest, PresentedSeq: w.Seq, HighestSeq: highestSeq}
	if *stale != want {
		t.Fatalf("StaleError %+v, want %+v", *stale, want)
	}
	if after, _ := rdb.Get(ctx, key).Result(); after != before {
		t.Fatalf("refused write changed %s from %q to %q", key, before, after)
	}
}

func TestOrder(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	accept(t, g, wr(sc, 41, 0))
	accept(t, g, wr(sc, 42, 0))
	refuse(t, rdb, g, wr(sc, 41, 0), 42, 0)
	accept(t, g, wr(sc, 42, 0))
	refuse(t, rdb, g, wr(sc, 1, 0), 42, 0)
	// Decimal strings: a shorter number is smaller whatever its digits.
	accept(t, g, wr(sc, 99, 0))
	accept(t, g, wr(sc, 100, 0))
	refuse(t, rdb, g, wr(sc, 99, 0), 100, 0)
	refuse(t, rdb, g, wr(sc, 9, 0), 100, 0)
	if got, _ := rdb.Get(ctx, redisguard.Key(sc, "v")).Result(); got != "100/0" {
		t.Fatalf("value %q, want the write of token 100", got)
	}
	other := newScope(t, rdb)
	accept(t, g, wr(other, 1, 0)) // scopes are independent
	refuse(t, rdb, g, wr(sc, 99, 0), 100, 0)
}

// TestTokensBeyondFloat uses tokens a double cannot tell apart: as Lua
// numbers 2^53 == 2^53+1 and 2^63-2 == 2^63-1 == 2^63, so a comparison
// through tonumber would accept the stale write.
func TestTokensBeyondFloat(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	const p53 = uint64(1) << 53
	for _, c := range []struct {
		name         string
		newer, older uint64
	}{
		{"2^53+2/2^53+1", p53 + 2, p53 + 1},
		{"2^53+1/2^53", p53 + 1, p53},
		{"2^63-1/2^63-2", fence.MaxToken, fence.MaxToken - 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc := newScope(t, rdb)
			accept(t, g, wr(sc, c.newer, 0))
			refuse(t, rdb, g, wr(sc, c.older, 0), c.newer, 0)
			accept(t, g, wr(sc, c.newer, 0))
			if m, err := g.Highest(ctx, sc); err != nil || m.Token != c.newer {
				t.Fatalf("Highest = %+v, %v; want token %d exactly", m, err, c.newer)
			}
		})
	}
	t.Run("sequence 2^63+1/2^63", func(t *testing.T) { // sequence numbers are uint64 too
		sc := newScope(t, rdb)
		accept(t, g, wr(sc, 7, 1<<63+1))
		refuse(t, rdb, g, wr(sc, 7, 1<<63), 7, 1<<63+1)
		accept(t, g, wr(sc, 7, 1<<64-1))
		refuse(t, rdb, g, wr(sc, 7, 1<<64-2), 7, 1<<64-1)
	})
}

func TestSequence(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	accept(t, g, wr(sc, 12, 1))
	accept(t, g, wr(sc, 12, 2))
	accept(t, g, wr(sc, 12, 2)) // not strict: the same sequence passes
	refuse(t, rdb, g, wr(sc, 12, 1), 12, 2)
	accept(t, g, wr(sc, 12, 0)) // no sequence: ordered by token alone
	accept(t, g, wr(sc, 13, 0))
	accept(t, g, wr(sc, 13, 1)) // a new epoch starts its own sequence
	refuse(t, rdb, g, wr(sc, 12, 9), 13, 1)

	sg := redisguard.New(rdb, redisguard.WithStrictSequence())
	sc = newScope(t, rdb)
	accept(t, sg, wr(sc, 12, 1))
	accept(t, sg, wr(sc, 12, 2))
	refuse(t, rdb, sg, wr(sc, 12, 2), 12, 2)
	refuse(t, rdb, sg, wr(sc, 12, 1), 12, 2)
	accept(t, sg, wr(sc, 12, 0))
	accept(t, sg, wr(sc, 13, 1))
	refuse(t, rdb, sg, wr(sc, 12, 9), 13, 1)
}

// TestMatchesCheck presents random writes to a scope and compares every
// outcome and the final mark with guard.Check and guard.Next on a model.
func TestMatchesCheck(t *testing.T) {
	rdb := testRedis(t)
	for _, strict := range []bool{false, true} {
		var opts []redisguard.Option
		if strict {
			opts = append(opts, redisguard.WithStrictSequence())
		}
		g := redisguard.New(rdb, opts...)
		sc := newScope(t, rdb)
		var model guard.Mark
		for range 300 {
			w := wr(sc, 1+rand.Uint64N(4), rand.Uint64N(4))
			want := guard.Check(sc, model, w, strict)
			got := set(g, w)
			if (want == nil) != (got == nil) {
				t.Fatalf("strict %v: write %+v over %+v: got %v, want %v", strict, w, model, got, want)
			}
			if want == nil {
				model = guard.Next(model, w)
			} else {
				var stale *guard.StaleError
				if !errors.As(got, &stale) || *stale != *want.(*guard.StaleError) {
					t.Fatalf("got %v, want %v", got, want)
				}
			}
			if m, err := g.Highest(ctx, sc); err != nil || m != model {
				t.Fatalf("mark %+v, %v; want %+v", m, err, model)
			}
		}
	}
}

func TestInvalid(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	for _, w := range []guard.Write{wr(sc, 0, 0), wr(sc, fence.MaxToken+1, 0), wr("", 1, 0)} {
		if err := set(g, w); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("write %+v = %v, want ErrInvalid", w, err)
		}
	}
	if _, err := g.HSet(ctx, wr(sc, 1, 0), redisguard.Key(sc, "h"), "odd"); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("HSet with an odd value count = %v, want ErrInvalid", err)
	}
	if _, err := g.Del(ctx, wr(sc, 1, 0)); !errors.Is(err, fence.ErrInvalid) {
		t.Errorf("Del without keys = %v, want ErrInvalid", err)
	}
}

func TestCommands(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	w, old := wr(sc, 5, 0), wr(sc, 4, 0)
	k, h, n := redisguard.Key(sc, "k"), redisguard.Key(sc, "h"), redisguard.Key(sc, "n")

	if err := g.Set(ctx, w, k, "x", time.Minute); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > time.Minute {
		t.Fatalf("TTL after Set with a minute = %v", ttl)
	}
	if err := g.Set(ctx, w, k, "y", redis.KeepTTL); err != nil {
		t.Fatal(err)
	}
	if v, ttl := rdb.Get(ctx, k).Val(), rdb.PTTL(ctx, k).Val(); v != "y" || ttl <= 0 {
		t.Fatalf("after KEEPTTL Set: %q, TTL %v", v, ttl)
	}
	if err := g.Set(ctx, w, k, 7, 0); err != nil {
		t.Fatal(err)
	}
	if v, ttl := rdb.Get(ctx, k).Val(), rdb.PTTL(ctx, k).Val(); v != "7" || ttl != -1 {
		t.Fatalf("after Set without expiry: %q, TTL %v", v, ttl)
	}

	if added, err := g.HSet(ctx, w, h, "a", 1, "b", "two"); err != nil || added != 2 {
		t.Fatalf("HSet = %d, %v", added, err)
	}
	if _, err := g.HSet(ctx, old, h, "a", "stale"); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale HSet = %v", err)
	}
	if v := rdb.HGetAll(ctx, h).Val(); v["a"] != "1" || v["b"] != "two" {
		t.Fatalf("hash %v", v)
	}

	if v, err := g.IncrBy(ctx, w, n, 40); err != nil || v != 40 {
		t.Fatalf("IncrBy = %d, %v", v, err)
	}
	if v, err := g.IncrBy(ctx, w, n, 2); err != nil || v != 42 {
		t.Fatalf("IncrBy = %d, %v", v, err)
	}
	if _, err := g.IncrBy(ctx, old, n, 1); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale IncrBy = %v", err)
	}
	if _, err := g.Del(ctx, old, n); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Del = %v", err)
	}
	if v := rdb.Get(ctx, n).Val(); v != "42" {
		t.Fatalf("counter %q after stale writes, want 42", v)
	}

	// A failing command leaves the mark alone: INCRBY on a hash fails.
	if _, err := g.IncrBy(ctx, wr(sc, 9, 0), h, 1); err == nil || errors.Is(err, fence.ErrStale) {
		t.Fatalf("IncrBy on a hash = %v, want WRONGTYPE", err)
	}
	if m, _ := g.Highest(ctx, sc); m.Token != 5 {
		t.Fatalf("mark after a failed write = %d, want 5", m.Token)
	}

	if removed, err := g.Del(ctx, w, k, h, n); err != nil || removed != 3 {
		t.Fatalf("Del = %d, %v", removed, err)
	}
}

func TestEval(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb)
	sc := newScope(t, rdb)
	a, b := redisguard.Key(sc, "a"), redisguard.Key(sc, "b")

	// The body sees its own KEYS and ARGV from 1.
	got, err := g.Eval(ctx, wr(sc, 3, 0), `
		redis.call('SET', KEYS[1], ARGV[1])
		redis.call('SET', KEYS[2], ARGV[2])
		return {#KEYS, #ARGV, KEYS[1], ARGV[2]}`, []string{a, b}, "one", "two")
	if err != nil {
		t.Fatal(err)
	}
	want := []any{int64(2), int64(2), a, "two"}
	if g, ok := got.([]any); !ok || len(g) != 4 || g[0] != want[0] || g[1] != want[1] || g[2] != want[2] || g[3] != want[3] {
		t.Fatalf("Eval = %#v, want %#v", got, want)
	}
	if rdb.Get(ctx, a).Val() != "one" || rdb.Get(ctx, b).Val() != "two" {
		t.Fatal("Eval body did not write")
	}

	// No reply is nil; a stale write does not run the body.
	if got, err := g.Eval(ctx, wr(sc, 3, 0), `redis.call('DEL', KEYS[1])`, []string{a}); err != nil || got != nil {
		t.Fatalf("Eval without a reply = %#v, %v", got, err)
	}
	if _, err := g.Eval(ctx, wr(sc, 2, 0), `redis.call('SET', KEYS[1], 'stale')`, []string{b}); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("stale Eval = %v", err)
	}
	if v := rdb.Get(ctx, b).Val(); v != "two" {
		t.Fatalf("stale Eval body ran: %q", v)
	}

	// A body that raises does not advance the mark.
	if _, err := g.Eval(ctx, wr(sc, 8, 0), `error('nope')`, nil); err == nil || errors.Is(err, fence.ErrStale) {
		t.Fatalf("raising Eval = %v, want the script error", err)
	}
	if m, _ := g.Highest(ctx, sc); m.Token != 3 {
		t.Fatalf("mark after a raising body = %d, want 3", m.Token)
	}

	// The body cannot reach the check's locals: without local, t and ht
	// would be globals, which Redis refuses.
	if _, err := g.Eval(ctx, wr(sc, 9, 0), `t = '1'; ht = '99'; s = '5'`, nil); err == nil {
		t.Fatal("Eval assigning t, ht and s without local succeeded")
	}
	if _, err := g.Eval(ctx, wr(sc, 9, 0), `local t, ht = '1', '99'; return less`, nil); err == nil {
		t.Fatal("Eval saw the check's less function")
	}
	if m, _ := g.Highest(ctx, sc); m.Token != 3 {
		t.Fatalf("mark after bodies touching the check's names = %d, want 3", m.Token)
	}
}

func TestLogsAndObservesStale(t *testing.T) {
	rdb := testRedis(t)
	var buf bytes.Buffer
	obs := &observer{}
	g := redisguard.New(rdb, redisguard.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))), redisguard.WithObserver(obs))
	sc := newScope(t, rdb)
	accept(t, g, wr(sc, 42, 0))
	refuse(t, rdb, g, wr(sc, 41, 0), 42, 0)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log %q: %v", buf.String(), err)
	}
	if rec["scope"] != sc || rec["presented_token"] != 41.0 || rec["highest_token"] != 42.0 || rec["level"] != "WARN" {
		t.Fatalf("log record %v", rec)
	}
	if obs.accepted != 1 || obs.rejected != 1 {
		t.Fatalf("observer saw %d accepted, %d rejected; want 1, 1", obs.accepted, obs.rejected)
	}
}

type observer struct{ accepted, rejected int }

func (o *observer) Accepted(string)            { o.accepted++ }
func (o *observer) Rejected(*guard.StaleError) { o.rejected++ }

// logScript sets the scope's value to the token and appends the token to
// the scope's log, in the fenced script.
const logScript = `
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])`

// TestConcurrent has many goroutines write random older and newer tokens
// to three scopes at once. Each scope's log, appended in the same script as
// the write, must be non-decreasing, and its value must be the write of
// the highest token presented: invariant 6 under interleavings.
func TestConcurrent(t *testing.T) {
	rdb := testRedis(t)
	g := redisguard.New(rdb, redisguard.WithLogger(slog.New(slog.DiscardHandler)))
	const workers, writes = 32, 50
	scopes := []string{newScope(t, rdb), newScope(t, rdb), newScope(t, rdb)}
	var (
		mu        sync.Mutex
		presented = map[string]uint64{}
		wg        sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range writes {
				sc := scopes[rand.IntN(len(scopes))]
				v := 1 + rand.Uint64N(100)
				mu.Lock()
				presented[sc] = max(presented[sc], v)
				mu.Unlock()
				_, err := g.Eval(ctx, wr(sc, v, 0), logScript,
					[]string{redisguard.Key(sc, "value"), redisguard.Key(sc, "log")}, v)
				if err != nil && !errors.Is(err, fence.ErrStale) {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, sc := range scopes {
		log, err := rdb.LRange(ctx, redisguard.Key(sc, "log"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		prev := uint64(0)
		for _, s := range log {
			v, _ := strconv.ParseUint(s, 10, 64)
			if v < prev {
				t.Fatalf("%s: wrote token %d after %d; log %v", sc, v, prev, log)
			}
			prev = v
		}
		if got := rdb.Get(ctx, redisguard.Key(sc, "value")).Val(); got != strconv.FormatUint(presented[sc], 10) {
			t.Fatalf("%s: value %q, but token %d was presented", sc, got, presented[sc])
		}
		t.Logf("%s: %d of %d-ish writes applied", sc, len(log), workers*writes/len(scopes))
	}
}

// TestSurvivesRestart: token 42 is accepted, redis-server restarts from its
// AOF, and a late write with 41 is still refused.
func TestSurvivesRestart(t *testing.T) {
	srv := startServer(t)
	rdb := srv.client(t)
	g := redisguard.New(rdb)
	const sc = "orders/shard-7"
	accept(t, g, wr(sc, 42, 0))
	srv.restart(t)
	rdb = srv.client(t)
	g = redisguard.New(rdb)
	refuse(t, rdb, g, wr(sc, 41, 0), 42, 0)
	if v := rdb.Get(ctx, redisguard.Key(sc, "v")).Val(); v != "42/0" {
		t.Fatalf("value after restart %q, want the write of 42", v)
	}
	accept(t, g, wr(sc, 42, 0))
}

func BenchmarkSet(b *testing.B) {
	rdb := testRedis(b)
	sc := newScope(b, rdb)
	key := redisguard.Key(sc, "v")
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			if err := rdb.Set(ctx, key, "value", 0).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fenced", func(b *testing.B) {
		g := redisguard.New(rdb)
		w := wr(sc, 42, 0)
		for b.Loop() {
			if err := g.Set(ctx, w, key, "value", 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestStoreSupersededAcrossStores: Store serializes apply only within one
// Store. When another Store (another process) advances the mark while
// apply runs, Fence reports it afterwards with ErrSuperseded.
func TestStoreSupersededAcrossStores(t *testing.T) {
	rdb := testRedis(t)
	a, b := redisguard.NewStore(rdb), redisguard.NewStore(rdb)
	sc := newScope(t, rdb)
	noop := func(context.Context) error { return nil }
	err := a.Fence(ctx, wr(sc, 41, 0), false, func(ctx context.Context) error {
		return b.Fence(ctx, wr(sc, 42, 0), false, noop)
	})
	var stale *guard.StaleError
	if !errors.Is(err, redisguard.ErrSuperseded) || !errors.As(err, &stale) || stale.Highest != 42 {
		t.Fatalf("Fence superseded during apply = %v, want ErrSuperseded with highest 42", err)
	}
	if m, _ := a.Highest(ctx, sc); m.Token != 42 {
		t.Fatalf("mark %d, want 42", m.Token)
	}
}

// TestGuardOverStore runs guard.Guard over a Store: scope check, logging.
func TestGuardOverStore(t *testing.T) {
	rdb := testRedis(t)
	var buf bytes.Buffer
	g := guard.New(redisguard.NewStore(rdb), guard.WithLogger(slog.New(slog.NewJSONHandler(&buf, nil))))
	sc := newScope(t, rdb)
	noop := func(context.Context) error { return nil }
	if err := g.Fence(ctx, sc, wr(sc, 42, 0), noop); err != nil {
		t.Fatal(err)
	}
	if err := g.Fence(ctx, sc, wr(sc, 41, 0), noop); !errors.Is(err, fence.ErrStale) {
		t.Fatalf("late 41 = %v", err)
	}
	if !bytes.Contains(buf.Bytes(), []byte(`"highest_token":42`)) {
		t.Fatalf("log %s", buf.String())
	}
}
