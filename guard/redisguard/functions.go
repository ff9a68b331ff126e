package redisguard

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// LibraryName is the name of the Redis Functions library that Library
// returns. Its suffix is the library's version: a change to what the
// functions accept or answer gets a new name, so FUNCTION LIST shows which
// one a server runs.
//
// Adding a function keeps the name: fence_advance came later than the
// others and changed nothing they accept or answer, and Redis function
// names are global to a server, so a fence_v2 with the same functions could
// not be loaded beside fence_v1 anyway. Whether a server's fence_v1 has
// fence_advance shows in FUNCTION LIST; loading Library again (LoadLibrary
// replaces it) adds it.
const LibraryName = "fence_v1"

//go:embed fence.lua
var functions string

// Library returns the source of the Redis Functions library (Redis 7.0 or
// later) that fences writes for clients in any language: fence_set,
// fence_del, fence_hset and fence_incrby, and fence_advance, which checks
// a token and advances its scope's mark without a write, called with
// FCALL. They keep the
// marks where a Guard with DefaultPrefix keeps them and decide with the
// same Lua, so Go and FCALL writers of a scope share one mark. The calls
// and their errors are described in the package documentation and in
// docs/protocol.md. Library is safe for concurrent use.
func Library() string {
	return "#!lua name=" + LibraryName + "\n" + rule + "\n" + functions
}

// LoadLibrary loads Library into rdb with FUNCTION LOAD REPLACE, so
// loading it again is harmless. Redis persists functions in its RDB and
// AOF and sends them to replicas, but a Redis Cluster keeps them per node:
// load the library on every primary (ClusterClient.ForEachMaster).
func LoadLibrary(ctx context.Context, rdb redis.Cmdable) error {
	if err := rdb.FunctionLoadReplace(ctx, Library()).Err(); err != nil {
		return fmt.Errorf("redisguard: load the function library %s: %w", LibraryName, err)
	}
	return nil
}
