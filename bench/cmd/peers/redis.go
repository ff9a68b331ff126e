package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// unlock deletes a lock key only if it still holds the caller's value: the
// release of the usual single-instance Redis lock (redsync, redislock).
var unlock = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// redisSetup prepares the usual single-instance Redis lock: SET key value
// NX PX ttl to take it, with a value unique to the holder, and the unlock
// script to give it back. One go-redis client with a connection per worker.
// Such a lock gives no fencing token.
//
//   - lock-cycle: take and give back the worker's own key.
//   - contended: one key; a worker that finds it held sleeps a random time
//     around the retry interval (-redis-retry, 10ms: uniform in 5-15ms)
//     and tries again, the polling of redsync and bsm/redislock (Redis has
//     no queue of waiters, and no fairness: a releaser may take the lock
//     straight back). Their defaults wait longer (redsync 50-250ms); of
//     0.5, 2, 10 and 50ms, 10ms gave Redis its best throughput here.
func redisSetup(ctx context.Context, a clientArgs) ([]op, func(), error) {
	rdb := redis.NewClient(&redis.Options{
		Addr: a.addr.redis, PoolSize: a.clients + 4, MinIdleConns: a.clients,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
	})
	u := undo{func() { rdb.Close() }}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return u.fail(err)
	}
	if err := unlock.Load(ctx, rdb).Err(); err != nil {
		return u.fail(err)
	}
	ops := make([]op, a.clients)
	pid := strconv.Itoa(os.Getpid())
	switch a.workload {
	case wlLockCycle, wlContended:
		for i := range ops {
			key := lockKey(a.workload, i)
			n := 0
			ops[i] = func(ctx context.Context) error {
				n++
				val := pid + "-" + strconv.Itoa(i) + "-" + strconv.Itoa(n)
				for {
					ok, err := rdb.SetNX(ctx, key, val, 10*time.Second).Result()
					if err != nil {
						return err
					}
					if ok {
						break
					}
					if a.workload == wlLockCycle {
						return errors.New("lock cycle: own key held")
					}
					// Uniform in [retry/2, 3*retry/2).
					d := a.redisRetry/2 + rand.N(a.redisRetry)
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				deleted, err := unlock.Run(ctx, rdb, []string{key}, val).Int()
				if err != nil {
					return err
				}
				if deleted != 1 {
					return fmt.Errorf("unlock %s: not held", key)
				}
				return nil
			}
		}
	default:
		return u.fail(fmt.Errorf("redis: no workload %q", a.workload))
	}
	return ops, u.run, nil
}
