package redisguard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
	"github.com/fence-dev/fence/guard/redisguard"
)

// A lease holder writes with its token; after a newer holder has written,
// the old one's late write is refused. (No Output: it needs a Redis.)
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	g := redisguard.New(rdb)

	const scope = "orders/shard-7"
	key := redisguard.Key(scope, "total") // "{orders/shard-7}:total", the mark's slot
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
}

// Eval runs the caller's Lua after the fence check, in the same script.
// KEYS and ARGV inside the body are the caller's own, numbered from 1.
func ExampleGuard_Eval() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	g := redisguard.New(rdb, redisguard.WithStrictSequence())

	const scope = "orders/shard-7"
	w := guard.Write{Token: fence.Token{Scope: scope, Value: 42}, Seq: 3}
	n, err := g.Eval(ctx, w, `
		redis.call('SET', KEYS[1], ARGV[1])
		return redis.call('RPUSH', KEYS[2], ARGV[1])`,
		[]string{redisguard.Key(scope, "value"), redisguard.Key(scope, "log")}, "v3")
	if errors.Is(err, fence.ErrStale) {
		return // the lease is lost: stop, never retry with this token
	}
	fmt.Println(n, err)
}
