package redisguard_test

// Tests of the Redis Functions library (fence.lua), driven by redis-cli:
// writers outside Go.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/guardtest"
	"github.com/fence-dev/fence/guard/redisguard"
)

// cli runs redis-cli against the Redis at url with the commands of input,
// one a line, and returns its replies, one a line. An error reply is a
// line like any other: redis-cli exits 0 all the same.
func cli(t testing.TB, url, input string) []string {
	t.Helper()
	bin, err := exec.LookPath("redis-cli")
	if err != nil {
		skipOrFail(t, "redis-cli not found: %v", err)
	}
	cmd := exec.Command(bin, "-u", url)
	cmd.Stdin = strings.NewReader(input)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli: %v\n%s", err, out)
	}
	return replyLines(string(out))
}

// replyLines returns the replies in redis-cli's output, one a line.
func replyLines(out string) []string {
	var replies []string
	for l := range strings.Lines(out) {
		if l = strings.TrimSpace(l); l != "" {
			replies = append(replies, l) // redis-cli follows an error with an empty line
		}
	}
	return replies
}

// one runs one command with redis-cli and returns its reply.
func one(t testing.TB, url, command string) string {
	t.Helper()
	r := cli(t, url, command+"\n")
	if len(r) != 1 {
		t.Fatalf("%s: replies %q, want one", command, r)
	}
	return r[0]
}

func testRedisURL(t testing.TB) string {
	t.Helper()
	rdb := testRedis(t) // skips, or fails in CI, without a Redis
	if err := redisguard.LoadLibrary(ctx, rdb); err != nil {
		t.Fatal(err)
	}
	if url := os.Getenv("FENCE_TEST_REDIS"); url != "" {
		return url
	}
	return "redis://127.0.0.1:63799/0"
}

func fset(scope string, token uint64, value string) string {
	return fmt.Sprintf("FCALL fence_set 2 fence:{%s} {%s}:v %d 0 %s", scope, scope, token, value)
}

func wantStaleReply(t testing.TB, reply, scope string, presented, highest uint64) {
	t.Helper()
	want := fmt.Sprintf("STALE scope=%s presented_token=%d highest_token=%d presented_seq=0 highest_seq=0", scope, presented, highest)
	if reply != want {
		t.Fatalf("reply %q, want %q", reply, want)
	}
}

// TestFunctionsConcurrentWriters has 16 redis-cli processes at once send 50
// fenced INCRBYs each, of older and newer tokens, to three scopes.
// Each accepted write's reply is its place in its scope's order, so
// ordered by it the accepted tokens must never go back, every refusal must
// be stale, and the mark must be the highest token presented: invariant 6
// for writers outside Go.
func TestFunctionsConcurrentWriters(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	if _, err := exec.LookPath("redis-cli"); err != nil {
		skipOrFail(t, "redis-cli not found: %v", err)
	}
	scopes := []string{newScope(t, rdb), newScope(t, rdb), newScope(t, rdb)}
	const writers, writes = 16, 50
	type write struct {
		scope int
		token uint64
		reply string
	}
	// Each writer is a redis-cli process reading its commands from a pipe,
	// fed a line to each in turn, so that they go on side by side.
	all := make([][]write, writers)
	cmds := make([]*exec.Cmd, writers)
	stdins := make([]io.WriteCloser, writers)
	outs := make([]strings.Builder, writers)
	for w := range writers {
		all[w] = make([]write, writes)
		for i := range all[w] {
			// Tokens grow as writers go on, and writers at the same point
			// overtake each other: some writes are stale.
			all[w][i] = write{scope: rand.N(len(scopes)), token: 1 + uint64(i)*8 + rand.Uint64N(64)}
		}
		cmds[w] = exec.Command("redis-cli", "-u", url)
		cmds[w].Stdout = &outs[w]
		var err error
		if stdins[w], err = cmds[w].StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := cmds[w].Start(); err != nil {
			t.Fatal(err)
		}
		c := cmds[w]
		t.Cleanup(func() { c.Process.Kill() }) // after Wait, a no-op
	}
	for i := range writes {
		for w := range writers {
			sc := scopes[all[w][i].scope]
			fmt.Fprintf(stdins[w], "FCALL fence_incrby 2 fence:{%s} {%s}:n %d 0 1\n", sc, sc, all[w][i].token)
		}
	}
	for w := range writers {
		stdins[w].Close()
		if err := cmds[w].Wait(); err != nil {
			t.Fatalf("redis-cli: %v", err)
		}
		replies := replyLines(outs[w].String())
		if len(replies) != writes {
			t.Fatalf("%d replies to %d writes: %q", len(replies), writes, replies)
		}
		for i := range all[w] {
			all[w][i].reply = replies[i]
		}
	}
	for i, sc := range scopes {
		byPlace := map[int]uint64{}
		top, stale := uint64(0), 0
		for _, w := range slices.Concat(all...) {
			if w.scope != i {
				continue
			}
			top = max(top, w.token)
			if n, err := strconv.Atoi(w.reply); err == nil {
				byPlace[n] = w.token
			} else if strings.HasPrefix(w.reply, "STALE ") {
				stale++
			} else {
				t.Fatalf("token %d: reply %q, want a count or STALE", w.token, w.reply)
			}
		}
		order := make([]uint64, 0, len(byPlace))
		for n := 1; n <= len(byPlace); n++ {
			v, ok := byPlace[n]
			if !ok {
				t.Fatalf("%s: no write was accepted as number %d of %d", sc, n, len(byPlace))
			}
			order = append(order, v)
		}
		if !slices.IsSorted(order) {
			t.Errorf("%s: accepted tokens in the order they were applied go back: %v", sc, order)
		}
		m, err := redisguard.New(rdb).Highest(ctx, sc)
		if err != nil {
			t.Fatal(err)
		}
		if m.Token != top {
			t.Errorf("%s: mark %d, want %d, the highest presented", sc, m.Token, top)
		}
		t.Logf("%s: %d writes accepted, %d refused as stale", sc, len(order), stale)
	}
}

// TestFunctionsRestart: a Redis that accepted token 42 through FCALL
// refuses a late 41 after a restart, with the library loaded by redis-cli
// from Library (as fencectl guard install --print | redis-cli -x would).
func TestFunctionsRestart(t *testing.T) {
	srv := startServer(t)
	url := "redis://" + srv.addr()
	cmd := exec.Command("redis-cli", "-u", url, "-x", "FUNCTION", "LOAD", "REPLACE")
	cmd.Stdin = strings.NewReader(redisguard.Library())
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != redisguard.LibraryName {
		t.Fatalf("FUNCTION LOAD: %v: %s", err, out)
	}
	if r := one(t, url, fset("jobs", 42, "a")); r != "OK" {
		t.Fatalf("token 42: %q", r)
	}
	srv.restart(t)
	wantStaleReply(t, one(t, url, fset("jobs", 41, "b")), "jobs", 41, 42)
	if r := one(t, url, "GET {jobs}:v"); r != "a" {
		t.Fatalf("value %q after the late write, want a", r)
	}
}

// TestFunctionsBeyondFloat compares tokens that doubles cannot tell apart,
// and the largest token.
func TestFunctionsBeyondFloat(t *testing.T) {
	url := testRedisURL(t)
	sc := newScope(t, testRedis(t))
	const p53 = 1 << 53
	if r := one(t, url, fset(sc, p53+1, "a")); r != "OK" {
		t.Fatalf("2^53+1: %q", r)
	}
	wantStaleReply(t, one(t, url, fset(sc, p53, "b")), sc, p53, p53+1)
	if r := one(t, url, fset(sc, fence.MaxToken, "c")); r != "OK" {
		t.Fatalf("2^63-1: %q", r)
	}
	wantStaleReply(t, one(t, url, fset(sc, fence.MaxToken-1, "d")), sc, fence.MaxToken-1, fence.MaxToken)
	if r := one(t, url, fset(sc, fence.MaxToken+1, "e")); !strings.HasPrefix(r, "ERR fence: token") {
		t.Fatalf("2^63: %q, want ERR fence: token ...", r)
	}
	if r := one(t, url, fmt.Sprintf("HGET fence:{%s} token", sc)); r != "9223372036854775807" {
		t.Fatalf("mark %q, want 2^63-1", r)
	}
}

// TestFunctionsShareGoMark has a Go Guard and redis-cli write one scope:
// each refuses what the other's higher token superseded.
func TestFunctionsShareGoMark(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	sc := newScope(t, rdb)
	g := redisguard.New(rdb, redisguard.WithLogger(slog.New(slog.DiscardHandler)))
	if err := set(g, wr(sc, 43, 0)); err != nil {
		t.Fatal(err)
	}
	wantStaleReply(t, one(t, url, fset(sc, 42, "cli")), sc, 42, 43)
	if r := one(t, url, fset(sc, 44, "cli")); r != "OK" {
		t.Fatalf("token 44: %q", r)
	}
	var stale *guard.StaleError
	if err := set(g, wr(sc, 43, 0)); !errors.As(err, &stale) || stale.Highest != 44 {
		t.Fatalf("Go write of 43 after FCALL's 44: %v, want stale against 44", err)
	}
	if v, _ := rdb.Get(ctx, redisguard.Key(sc, "v")).Result(); v != "cli" {
		t.Fatalf("value %q, want FCALL's", v)
	}
}

// TestFunctions runs each function, and the calls they refuse without
// changing anything.
func TestFunctions(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	sc, other := newScope(t, rdb), newScope(t, rdb)
	m, k := "fence:{"+sc+"}", "{"+sc+"}:"
	for _, c := range []struct{ call, want string }{
		{"FCALL fence_set 2 " + m + " " + k + "s 5 0 v PX 60000", "OK"},
		{"FCALL fence_hset 2 " + m + " " + k + "h 5 0 f1 a f2 b", "2"},
		{"FCALL fence_incrby 2 " + m + " " + k + "n 5 1 7", "7"},
		{"FCALL fence_incrby 2 " + m + " " + k + "n 5 1 7", "14"}, // an equal sequence is accepted
		{"FCALL fence_del 3 " + m + " " + k + "s " + k + "h 6 0", "2"},
		{"FCALL fence_incrby 2 " + m + " " + k + "n 5 9 1", "STALE scope=" + sc + " presented_token=5 highest_token=6 presented_seq=9 highest_seq=0"},
		{"FCALL fence_set 2 " + m + " {" + other + "}:s 7 0 v", "ERR fence: key"},
		{"FCALL fence_set 2 " + m + " untagged 7 0 v", "ERR fence: key"},
		{"FCALL fence_set 2 " + m + " fence:{" + other + "} 7 0 v", "ERR fence: \"fence:{"},
		{"FCALL fence_set 2 " + k + "n " + k + "s 7 0 v", "ERR fence: the first key"},
		{"FCALL fence_set 2 fence:{a/../b} {a/../b}:s 7 0 v", "ERR fence: \"a/../b\" is not a scope"},
		{"FCALL fence_set 2 " + m + " " + k + "s 07 0 v", "ERR fence: token \"07\""},
		{"FCALL fence_set 2 " + m + " " + k + "s 0 0 v", "ERR fence: token \"0\""},
		{"FCALL fence_set 2 " + m + " " + k + "s 7 -1 v", "ERR fence: sequence \"-1\""},
		{"FCALL fence_set 2 " + m + " " + k + "s 7 0", "ERR fence: want TOKEN SEQ"},
		{"FCALL fence_set 3 " + m + " " + k + "s " + k + "t 7 0 v", "ERR fence: want 2 keys"},
		{"FCALL fence_del 1 " + m + " 7 0", "ERR fence: want the mark"},
	} {
		if r := one(t, url, c.call); !strings.HasPrefix(r, c.want) {
			t.Errorf("%s: %q, want %q...", c.call, r, c.want)
		}
	}
	if r := cli(t, url, "HMGET "+m+" token seq\nGET "+k+"n\n"); !slices.Equal(r, []string{"6", "0", "14"}) {
		t.Errorf("mark and counter %q, want 6 0 14", r)
	}
}

// TestFunctionsProtocolVectors runs the comparison cases of the guard
// protocol's test vectors (testdata/protocol/vectors.json) through FCALL
// fence_set and through fence_advance: the mark at the case's highest
// token and sequence, then the presented one, accepted or refused as stale
// as the case says.
func TestFunctionsProtocolVectors(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	for _, fn := range []string{"fence_set", "fence_advance"} {
		for _, c := range guardtest.CompareVectors(t) {
			sc := newScope(t, rdb)
			call := func(token string, seq uint64) string {
				if fn == "fence_advance" {
					return fmt.Sprintf("FCALL fence_advance 1 fence:{%s} %s %d", sc, token, seq)
				}
				return fmt.Sprintf("FCALL fence_set 2 fence:{%s} {%s}:v %s %d x", sc, sc, token, seq)
			}
			if r := one(t, url, call(c.Highest, c.HighestSequence)); r != "OK" {
				t.Fatalf("%s: %s: setting the mark at %s: %q", fn, c.Why, c.Highest, r)
			}
			r := one(t, url, call(c.Presented, c.PresentedSequence))
			switch {
			case c.Accepted && r != "OK":
				t.Errorf("%s: %s (%s after %s): %q, want OK", fn, c.Why, c.Presented, c.Highest, r)
			case !c.Accepted && !strings.HasPrefix(r, "STALE "):
				t.Errorf("%s: %s (%s after %s): %q, want STALE", fn, c.Why, c.Presented, c.Highest, r)
			}
		}
	}
}

// TestFunctionsRefuseMistypedMark: the first key must be the scope's mark
// as redisguard keeps it, "fence:{SCOPE}". A writer whose mark key has
// another prefix (a typo, a prefix of its own) would otherwise get a fresh
// mark of its own, and its stale token would pass; each such call is
// refused as malformed, naming the form, and changes nothing.
func TestFunctionsRefuseMistypedMark(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	sc := newScope(t, rdb)
	if r := one(t, url, fset(sc, 9, "current")); r != "OK" {
		t.Fatalf("token 9: %q", r)
	}
	for _, mark := range []string{
		"fense:{" + sc + "}", "Fence:{" + sc + "}", "fence{" + sc + "}", "fence_{" + sc + "}",
		"{" + sc + "}", "app:fence:{" + sc + "}", "fence:fence:{" + sc + "}", "fence::{" + sc + "}",
	} {
		r := one(t, url, fmt.Sprintf("FCALL fence_set 2 %s {%s}:v 7 0 stale", mark, sc))
		want := fmt.Sprintf("ERR fence: the first key, %q, is not the mark of a scope: want \"fence:{SCOPE}\"", mark)
		if !strings.HasPrefix(r, want) {
			t.Errorf("mark key %q: %q, want %q...", mark, r, want)
		}
		if n, err := rdb.Exists(ctx, mark).Result(); err != nil || n != 0 {
			t.Errorf("mark key %q: it exists (%d, %v), want it never created", mark, n, err)
		}
	}
	if r := cli(t, url, "GET {"+sc+"}:v\nHGET fence:{"+sc+"} token\n"); !slices.Equal(r, []string{"current", "9"}) {
		t.Errorf("value and mark %q, want the current write and 9", r)
	}
}

// fadvance is FCALL fence_advance on scope's mark.
func fadvance(scope string, token, seq uint64) string {
	return fmt.Sprintf("FCALL fence_advance 1 fence:{%s} %d %d", scope, token, seq)
}

// wantMark fails t unless scope's mark is token and seq and the scope has
// no key but its mark: fence_advance writes nothing else.
func wantMark(t *testing.T, rdb *redis.Client, scope, token, seq string) {
	t.Helper()
	if r, err := rdb.HMGet(ctx, "fence:{"+scope+"}", "token", "seq").Result(); err != nil || !slices.Equal(r, []any{token, seq}) {
		t.Errorf("mark %q (%v), want %s %s", r, err, token, seq)
	}
	if keys, err := rdb.Keys(ctx, "*{"+scope+"}*").Result(); err != nil || !slices.Equal(keys, []string{"fence:{" + scope + "}"}) {
		t.Errorf("the scope's keys %q (%v), want its mark alone", keys, err)
	}
}

// TestFunctionsAdvance: fence_advance checks a token as the writes do and
// moves the mark, with no write, so that writes and calls it superseded
// are refused afterwards; a stale call changes nothing.
func TestFunctionsAdvance(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	sc := newScope(t, rdb)
	stale := func(token, highest, seq, highestSeq uint64) string {
		return fmt.Sprintf("STALE scope=%s presented_token=%d highest_token=%d presented_seq=%d highest_seq=%d", sc, token, highest, seq, highestSeq)
	}
	if r := one(t, url, fadvance(sc, 7, 0)); r != "OK" {
		t.Fatalf("advance to 7 on no mark: %q, want OK", r)
	}
	wantMark(t, rdb, sc, "7", "0")

	// A write of a lower token is stale and writes nothing.
	wantStaleReply(t, one(t, url, fset(sc, 6, "late")), sc, 6, 7)
	if n, err := rdb.Exists(ctx, redisguard.Key(sc, "v")).Result(); err != nil || n != 0 {
		t.Fatalf("the stale write's key exists (%d, %v)", n, err)
	}
	// So is a Go Guard's, which reads the same mark.
	var se *guard.StaleError
	if err := set(redisguard.New(rdb, redisguard.WithLogger(slog.New(slog.DiscardHandler))), wr(sc, 6, 0)); !errors.As(err, &se) || se.Highest != 7 {
		t.Fatalf("Go write of 6 after fence_advance's 7: %v, want stale against 7", err)
	}
	// And an advance of a lower token, which leaves the mark where it was.
	if r := one(t, url, fadvance(sc, 6, 0)); r != stale(6, 7, 0, 0) {
		t.Fatalf("advance to 6 after 7: %q, want %q", r, stale(6, 7, 0, 0))
	}
	wantMark(t, rdb, sc, "7", "0")

	// An equal token advances the sequence, an equal sequence is accepted
	// and changes nothing, and a lower one is stale.
	if r := one(t, url, fadvance(sc, 7, 3)); r != "OK" {
		t.Fatalf("advance to 7 sequence 3: %q, want OK", r)
	}
	wantMark(t, rdb, sc, "7", "3")
	if r := one(t, url, fadvance(sc, 7, 3)); r != "OK" {
		t.Fatalf("advance to 7 sequence 3 again: %q, want OK", r)
	}
	if r := one(t, url, fadvance(sc, 7, 2)); r != stale(7, 7, 2, 3) {
		t.Fatalf("advance to 7 sequence 2 after 3: %q, want %q", r, stale(7, 7, 2, 3))
	}
	wantMark(t, rdb, sc, "7", "3")
	if r := one(t, url, fmt.Sprintf("FCALL fence_set 2 fence:{%s} {%s}:v 7 2 late", sc, sc)); r != stale(7, 7, 2, 3) {
		t.Fatalf("write of 7 sequence 2 after advance to 3: %q, want %q", r, stale(7, 7, 2, 3))
	}
	// A token of no sequence is not below any sequence of its own value.
	if r := one(t, url, fadvance(sc, 7, 0)); r != "OK" {
		t.Fatalf("advance to 7 sequence 0 after 3: %q, want OK", r)
	}
	wantMark(t, rdb, sc, "7", "3")

	// A greater token starts its own sequence, and its writes pass.
	if r := one(t, url, fadvance(sc, 8, 0)); r != "OK" {
		t.Fatalf("advance to 8: %q, want OK", r)
	}
	wantMark(t, rdb, sc, "8", "0")
	if r := one(t, url, fset(sc, 8, "current")); r != "OK" {
		t.Fatalf("write of 8 after advance to 8: %q, want OK", r)
	}
	if r := one(t, url, fadvance(sc, fence.MaxToken, 0)); r != "OK" {
		t.Fatalf("advance to 2^63-1: %q, want OK", r)
	}
	wantStaleReply(t, one(t, url, fadvance(sc, fence.MaxToken-1, 0)), sc, fence.MaxToken-1, fence.MaxToken)
}

// TestFunctionsAdvanceRefuses: fence_advance takes the mark alone and
// TOKEN SEQ, checked as the writes check them; a malformed call is refused
// with ERR fence: and changes nothing, and a mark key of the wrong form is
// never created.
func TestFunctionsAdvanceRefuses(t *testing.T) {
	url := testRedisURL(t)
	rdb := testRedis(t)
	sc := newScope(t, rdb)
	m := "fence:{" + sc + "}"
	if r := one(t, url, fadvance(sc, 5, 1)); r != "OK" {
		t.Fatalf("advance to 5 sequence 1: %q", r)
	}
	for _, c := range []struct{ call, want string }{
		{"FCALL fence_advance 0 9 0", "ERR fence: want 1 key: the mark alone"},
		{"FCALL fence_advance 2 " + m + " {" + sc + "}:v 9 0", "ERR fence: want 1 key: the mark alone"},
		{"FCALL fence_advance 2 " + m + " " + m + " 9 0", "ERR fence: want 1 key: the mark alone"},
		{"FCALL fence_advance 1 " + m + " 9 0 value", "ERR fence: fence_advance takes TOKEN SEQ and nothing more"},
		{"FCALL fence_advance 1 " + m + " 9", "ERR fence: want TOKEN SEQ"},
		{"FCALL fence_advance 1 " + m, "ERR fence: want TOKEN SEQ"},
		{"FCALL fence_advance 1 " + m + " 0 0", `ERR fence: token "0" is not a decimal integer from 1 to 9223372036854775807`},
		{"FCALL fence_advance 1 " + m + " 09 0", `ERR fence: token "09"`},
		{"FCALL fence_advance 1 " + m + " -9 0", `ERR fence: token "-9"`},
		{"FCALL fence_advance 1 " + m + " 9.0 0", `ERR fence: token "9.0"`},
		{"FCALL fence_advance 1 " + m + " 9223372036854775808 0", `ERR fence: token "9223372036854775808"`},
		{"FCALL fence_advance 1 " + m + " 9 -1", `ERR fence: sequence "-1" is not a decimal integer from 0 to 18446744073709551615`},
		{"FCALL fence_advance 1 " + m + " 9 01", `ERR fence: sequence "01"`},
		{"FCALL fence_advance 1 " + m + " 9 18446744073709551616", `ERR fence: sequence "18446744073709551616"`},
		{"FCALL fence_advance 1 {" + sc + "} 9 0", `ERR fence: the first key, "{` + sc + `}", is not the mark of a scope`},
		{"FCALL fence_advance 1 fense:{" + sc + "} 9 0", `ERR fence: the first key, "fense:{` + sc + `}", is not the mark of a scope`},
		{"FCALL fence_advance 1 app:" + m + " 9 0", `ERR fence: the first key, "app:` + m + `", is not the mark of a scope`},
		{"FCALL fence_advance 1 {" + sc + "}:v 9 0", `ERR fence: the first key, "{` + sc + `}:v", is not the mark of a scope`},
		{"FCALL fence_advance 1 fence:{a/../b} 9 0", `ERR fence: "a/../b" is not a scope`},
	} {
		if r := one(t, url, c.call); !strings.HasPrefix(r, c.want) {
			t.Errorf("%s: %q, want %q...", c.call, r, c.want)
		}
	}
	wantMark(t, rdb, sc, "5", "1")
	for _, k := range []string{"fense:{" + sc + "}", "app:" + m} {
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("%q exists (%d, %v), want it never created", k, n, err)
		}
	}
}
