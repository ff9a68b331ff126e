package redisguard_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisOptions says where the examples find Redis, as the tests find
// theirs: FENCE_TEST_REDIS, or the server of `make services`.
func redisOptions() *redis.Options {
	url := os.Getenv("FENCE_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:63799/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		panic(fmt.Sprintf("FENCE_TEST_REDIS=%q: %v", url, err))
	}
	return opt
}

// skipExamplesWithoutServer makes the examples, whose output is what a
// real server answers, skip like the tests when Redis is unreachable; in
// CI they run, and fail. An example cannot skip itself, so this adds
// ^Example to -test.skip before the tests start. Called by TestMain.
func skipExamplesWithoutServer() {
	flag.Parse()
	if os.Getenv("CI") == "true" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	opt := redisOptions()
	rdb := redis.NewClient(opt)
	err := rdb.Ping(ctx).Err()
	rdb.Close()
	if err == nil {
		return
	}
	skip := flag.Lookup("test.skip").Value.String()
	if strings.Contains(skip, "/") {
		return // cannot join a pattern with subtests; let the examples fail
	}
	if skip != "" {
		skip += "|"
	}
	_ = flag.Set("test.skip", skip+"^Example")
	fmt.Fprintf(os.Stderr, "redisguard: skipping the examples: Redis at %s is unreachable: %v (run `make services`, or set FENCE_TEST_REDIS)\n", opt.Addr, err)
}
