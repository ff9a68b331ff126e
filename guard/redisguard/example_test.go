package redisguard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/redisguard"
)

// A lease holder writes with its token; after a newer holder has written,
// the old one's late write is refused. It runs against Redis (`make
// services`, or FENCE_TEST_REDIS).
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(redisOptions()) // e.g. &redis.Options{Addr: "127.0.0.1:6379"}
	defer rdb.Close()
	g := redisguard.New(rdb)

	const scope = "example/orders/shard-7"
	key := redisguard.Key(scope, "total") // "{example/orders/shard-7}:total", the mark's slot
	rdb.Del(ctx, g.MarkKey(scope), key)   // afresh: the example runs again and again
	a := guard.Write{Token: fence.Token{Scope: scope, Value: 41}}
	b := guard.Write{Token: fence.Token{Scope: scope, Value: 42}}

	if err := g.Set(ctx, b, key, "from B", 0); err != nil {
		fmt.Println(err)
		return
	}
	err := g.Set(ctx, a, key, "from A", 0)
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		fmt.Printf("refused: presented %d, highest %d\n", stale.Presented, stale.Highest)
	}
	fmt.Println(rdb.Get(ctx, key).Val())
	// Output:
	// refused: presented 41, highest 42
	// from B
}

// Eval runs the caller's Lua after the fence check, in the same script.
// KEYS and ARGV inside the body are the caller's own, numbered from 1.
func ExampleGuard_Eval() {
	ctx := context.Background()
	rdb := redis.NewClient(redisOptions())
	defer rdb.Close()
	g := redisguard.New(rdb, redisguard.WithStrictSequence())

	const scope = "example/orders/shard-7"
	valueKey, logKey := redisguard.Key(scope, "value"), redisguard.Key(scope, "log")
	rdb.Del(ctx, g.MarkKey(scope), valueKey, logKey) // afresh: the example runs again and again
	w := guard.Write{Token: fence.Token{Scope: scope, Value: 42}, Seq: 3}
	n, err := g.Eval(ctx, w, `
		redis.call('SET', KEYS[1], ARGV[1])
		return redis.call('RPUSH', KEYS[2], ARGV[1])`,
		[]string{valueKey, logKey}, "v3")
	if errors.Is(err, fence.ErrStale) {
		return // the lease is lost: stop, never retry with this token
	}
	fmt.Println(n, err)

	// The same sequence again is refused: WithStrictSequence wants it to grow.
	_, err = g.Eval(ctx, w, `return redis.call('SET', KEYS[1], ARGV[1])`, []string{valueKey}, "v3 again")
	fmt.Println(errors.Is(err, fence.ErrStale))
	// Output:
	// 1 <nil>
	// true
}

// Keys that do not carry their scope in braces, as on a single Redis with
// an older naming scheme, are refused unless WithKeyScope says which scope
// each belongs to: here "orders:shard-7:total" to "example/orders/shard-7".
func ExampleWithKeyScope() {
	ctx := context.Background()
	rdb := redis.NewClient(redisOptions())
	defer rdb.Close()
	const scope = "example/orders/shard-7"
	const key = "orders:shard-7:total"
	w := guard.Write{Token: fence.Token{Scope: scope, Value: 42}}

	err := redisguard.New(rdb).Set(ctx, w, key, "10", 0)
	fmt.Println(errors.Is(err, guard.ErrWrongScope))

	g := redisguard.New(rdb, redisguard.WithKeyScope(func(key string) string {
		shard, _, _ := strings.Cut(strings.TrimPrefix(key, "orders:"), ":")
		return "example/orders/" + shard
	}))
	rdb.Del(ctx, g.MarkKey(scope), key) // afresh: the example runs again and again
	fmt.Println(g.Set(ctx, w, key, "10", 0), rdb.Get(ctx, key).Val())
	// Output:
	// true
	// <nil> 10
}
