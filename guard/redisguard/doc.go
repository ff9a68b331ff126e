// Package redisguard fences writes to Redis: each write carries a fencing
// token, and one Lua script checks the token against the highest one its
// scope has accepted, applies the write and records the new highest mark,
// so nothing can run between the check and the write. The mark lives in the
// same Redis as the data and is as durable as that Redis is configured to
// be (use AOF with appendfsync always when a late stale write after a crash
// must still be refused).
//
// # Usage
//
// Make one Guard per Redis client and pass each write's guard.Write:
//
//	g := redisguard.New(rdb, redisguard.WithStrictSequence())
//	w := guard.Write{Token: lease.Token()}
//	err := g.Set(ctx, w, redisguard.Key("orders/shard-7", "total"), "42", 0)
//	if errors.Is(err, fence.ErrStale) {
//		// the lease is lost: stop, do not retry with this token
//	}
//
// Set, Del, HSet and IncrBy are fenced versions of the Redis commands. Eval
// runs the caller's own Lua after the check, in the same script; inside it
// KEYS and ARGV are the caller's keys and arguments, numbered from 1:
//
//	_, err := g.Eval(ctx, w, `
//		redis.call('SET', KEYS[1], ARGV[1])
//		return redis.call('RPUSH', KEYS[2], ARGV[1])`,
//		[]string{redisguard.Key(scope, "value"), redisguard.Key(scope, "log")}, "v1")
//
// A stale write returns a *guard.StaleError (errors.Is fence.ErrStale) with
// the scope, the presented and the highest token and sequence; the Guard
// logs it with slog (fields scope, presented_token, highest_token) and
// reports it to an optional guard.Observer.
//
// # Keys
//
// The mark of scope s is the hash "fence:{s}" (DefaultPrefix, see
// WithPrefix) with the fields token and seq, stored as decimal strings.
// The braces make s the key's hash tag. In Redis Cluster a script may touch
// only keys of one slot, so every data key of a fenced write must carry the
// same tag: build them with Key(s, name), which gives "{s}:name".
//
// The tag is also what says which scope a key belongs to, on a single
// Redis as in a cluster: a write is refused (guard.ErrWrongScope, nothing
// changed) unless every key it touches carries its token's scope as its
// hash tag. A token of scope t cannot write Key(s, name), nor a key with
// no tag, which no scope's lease would otherwise own. A keyspace whose
// names do not carry their scope can say which scope each key belongs to
// with WithKeyScope instead. No write may touch a mark key (fence.ErrInvalid).
//
// Tokens and sequence numbers are unsigned 64-bit integers. Lua numbers in
// Redis are doubles, exact only to 2^53, so the scripts never convert them:
// they compare canonical decimal strings by length, then bytewise.
//
// # Writers in other languages
//
// Library is a Redis Functions library (Redis 7.0 or later), named
// LibraryName ("fence_v1"), with fenced SET, DEL, HSET and INCRBY, and a
// check and advance with no write, for clients in any language.
// LoadLibrary (or `fencectl guard install redis://...`) loads it. The
// functions keep marks where a Guard with DefaultPrefix does and decide
// with the same Lua (rule.lua), so Go and FCALL writers of a scope share
// one mark:
//
//	FCALL fence_set     2   fence:{S} KEY    TOKEN SEQ VALUE [SET option ...]
//	FCALL fence_del     1+N fence:{S} KEY... TOKEN SEQ
//	FCALL fence_hset    2   fence:{S} KEY    TOKEN SEQ FIELD VALUE [FIELD VALUE ...]
//	FCALL fence_incrby  2   fence:{S} KEY    TOKEN SEQ INCREMENT
//	FCALL fence_advance 1   fence:{S}        TOKEN SEQ
//
// fence_advance is PostgreSQL's and MySQL's fence_advance for Redis: it
// takes the mark alone (a data key, or an argument after SEQ, is refused),
// checks the token as the writes do, advances the mark and answers OK,
// for a caller whose write lands elsewhere or that only moves marks (a
// follower of the service's leases).
//
// The first key is the scope's mark exactly as DefaultPrefix makes it,
// "fence:{S}": a key of any other prefix would be a fresh mark that no
// other writer reads, so the functions refuse it ("ERR fence: the first
// key ... is not the mark of a scope"). Every KEY must carry the scope as
// its hash tag (see Key); SEQ 0 means none, and sequences follow the
// non-strict rule. A stale write changes nothing and returns the error
// "STALE scope=S presented_token=T highest_token=H presented_seq=Q
// highest_seq=R"; a malformed call an error starting "ERR fence:". The
// Guard does not call the library: it needs no install, and its scripts
// run the same rule. docs/protocol.md, "Guards inside the database", has
// the whole contract.
//
// # Caveats
//
// Redis scripts are atomic but not transactional: if a command inside a
// fenced write fails (say INCRBY on a string), the mark is not advanced,
// but commands that ran before the failure in an Eval body stay applied.
//
// The functions check no signature, and a Go Guard checks one in its own
// process: any Redis user that may write a mark key, or call the
// functions, can set a mark to 2^63-1 and lock the scope's holders out.
// Only Redis's ACL can keep it to the writers and the follower
// (docs/security.md, "Who may move a mark", has the rules).
//
// The fence is only as durable as the Redis: without AOF and
// appendfsync always, a crash can lose an accepted mark together with the
// write it fenced, and then a late stale write is accepted after restart.
// A failover to a replica that missed the last writes has the same effect.
//
// Store implements guard.Store for a guard.Guard whose writes go elsewhere.
// Its apply is Go code and cannot run inside a script: Store serializes
// Fence per scope within one process and records the mark in Redis only
// after apply succeeds, so it is atomic only among the Fence calls of one
// Store. For data in Redis use Guard's scripts; see Store for the rest.
package redisguard
