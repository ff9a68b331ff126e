package redisguard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fence-dev/fence"
	"github.com/fence-dev/fence/guard"
)

// DefaultPrefix is the start of every mark key: the mark of scope s lives in
// the hash "fence:{s}" (fields token and seq).
const DefaultPrefix = "fence:"

// rule is the fence rule of guard.Check in Lua (less, check and advance),
// shared with the functions library (Library), so that the Go guard and
// FCALL writers decide alike.
//
//go:embed rule.lua
var rule string

// checkCall runs the rule's check for a script's write. KEYS[1] is the
// mark; ARGV[1] the token, ARGV[2] the sequence ("0": none), ARGV[3] "1"
// for strict sequences. A stale write returns {"stale", highest token,
// highest sequence} before touching anything.
const checkCall = `
local mark, t, s = KEYS[1], ARGV[1], ARGV[2]
local stale, ht, hs = check(mark, t, s, ARGV[3] == '1')
if stale then return {'stale', ht, hs} end
`

// fenced builds a script that checks, runs op (which must set the local r,
// the write's reply), advances the mark and returns {"ok", r}. The data
// keys are KEYS[2] on, the write's arguments ARGV[4] on.
func fenced(op string) *redis.Script { return fencedAfter("", op) }

// fencedAfter is fenced with pre placed before the check, where code does
// not see the check's locals.
func fencedAfter(pre, op string) *redis.Script {
	return redis.NewScript(pre + rule + checkCall + op + "\nadvance(mark, t, s, ht, hs)\nreturn {'ok', r}\n")
}

var (
	setScript = fenced(`local r
if ARGV[5] == '' then r = redis.call('SET', KEYS[2], ARGV[4])
elseif ARGV[5] == 'KEEPTTL' then r = redis.call('SET', KEYS[2], ARGV[4], 'KEEPTTL')
else r = redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5]) end`)
	delScript    = fenced(`local r = redis.call('DEL', unpack(KEYS, 2))`)
	hsetScript   = fenced(`local r = redis.call('HSET', KEYS[2], unpack(ARGV, 4))`)
	incrByScript = fenced(`local r = redis.call('INCRBY', KEYS[2], ARGV[4])`)
	// checkScript only checks; advanceScript checks again and records.
	// Store.Fence runs the caller's apply between the two.
	checkScript   = redis.NewScript(rule + checkCall + "return {'ok'}\n")
	advanceScript = fenced(`local r`)
)

// userScript wraps a caller's Lua body. The body runs as a function whose
// parameters KEYS and ARGV shadow the script's own, so it sees only its own
// keys and arguments, numbered from 1. It is defined before the rule and
// the check, so it cannot see (or, by forgetting local, overwrite) their
// locals.
func userScript(body string) *redis.Script {
	return fencedAfter("local function body(KEYS, ARGV)\n"+body+"\nend\n",
		"local r = body({unpack(KEYS, 2)}, {unpack(ARGV, 4)})")
}

// Option configures a Guard or a Store.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	prefix   string
	strict   bool
	log      *slog.Logger
	obs      guard.Observer
	verify   guard.Verifier
	keyScope func(key string) string
}

// WithVerifier makes a Guard accept only tokens v verifies (see
// guard.WithVerifier); a refused token never reaches Redis.
func WithVerifier(v guard.Verifier) Option { return optionFunc(func(c *config) { c.verify = v }) }

// WithStrictSequence makes a Guard refuse, inside one epoch, a write whose
// sequence number is not greater than the last accepted one (guard.Check's
// strict rule). A Store ignores it: guard.Guard passes strict to Fence.
func WithStrictSequence() Option { return optionFunc(func(c *config) { c.strict = true }) }

// WithLogger logs every stale rejection of a Guard to l (default
// slog.Default()) with the fields scope, presented_token, highest_token,
// presented_seq and highest_seq.
func WithLogger(l *slog.Logger) Option { return optionFunc(func(c *config) { c.log = l }) }

// WithObserver reports every accepted and rejected write of a Guard to o,
// as guard.WithObserver does (guardmetrics has a Prometheus one).
func WithObserver(o guard.Observer) Option { return optionFunc(func(c *config) { c.obs = o }) }

// WithPrefix replaces DefaultPrefix: the mark of scope s becomes the hash
// prefix+"{"+s+"}". The function library (Library) keeps marks under
// DefaultPrefix only and refuses any other mark key, so a Guard with
// another prefix shares no mark with FCALL writers: give it only to a
// keyspace they do not write.
func WithPrefix(p string) Option { return optionFunc(func(c *config) { c.prefix = p }) }

// WithKeyScope makes a Guard ask f which scope each data key belongs to,
// instead of reading the key's hash tag: for a single Redis whose keys do
// not carry their scope in braces. A write is refused unless f names the
// scope of its token for every key it touches, so f must give every key
// exactly one scope, the one whose lease may write it; f must be safe for
// concurrent use. Redis Cluster needs the hash tags anyway (a script's
// keys must share the mark's slot): use Key there. A Store ignores it.
func WithKeyScope(f func(key string) string) Option {
	return optionFunc(func(c *config) { c.keyScope = f })
}

func newConfig(opts []Option) config {
	c := config{prefix: DefaultPrefix, log: slog.Default()}
	for _, o := range opts {
		o.apply(&c)
	}
	return c
}

// Guard runs fenced writes on a Redis: each checks the write's token against
// its scope's mark, applies the write and advances the mark in one Lua
// script, so no other command runs between check and write. It is safe for
// concurrent use, by any number of processes sharing the Redis.
type Guard struct {
	rdb  redis.UniversalClient
	cfg  config
	user sync.Map // Lua body → *redis.Script
}

// New returns a Guard that keeps marks and data in rdb.
func New(rdb redis.UniversalClient, opts ...Option) *Guard {
	return &Guard{rdb: rdb, cfg: newConfig(opts)}
}

// MarkKey returns the key of the hash that holds scope's highest accepted
// mark (fields token and seq, decimal strings). The scope is its hash tag.
func (g *Guard) MarkKey(scope string) string { return g.cfg.prefix + "{" + scope + "}" }

// Key returns a data key for name in scope's hash-tag slot: "{scope}:name".
// In Redis Cluster every key a fenced write touches must hash to the mark's
// slot; keys built with Key always do. Key is safe for concurrent use.
func Key(scope, name string) string { return "{" + scope + "}:" + name }

// Highest returns the highest mark accepted for scope (zero if none).
func (g *Guard) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	return highest(ctx, g.rdb, g.cfg.prefix+"{"+scope+"}")
}

func highest(ctx context.Context, rdb redis.UniversalClient, key string) (guard.Mark, error) {
	v, err := rdb.HMGet(ctx, key, "token", "seq").Result()
	if err != nil {
		return guard.Mark{}, fmt.Errorf("read mark %q: %w", key, err)
	}
	var m guard.Mark
	for i, p := range []*uint64{&m.Token, &m.Seq} {
		if s, ok := v[i].(string); ok {
			if *p, err = strconv.ParseUint(s, 10, 64); err != nil {
				return guard.Mark{}, fmt.Errorf("read mark %q: %w", key, err)
			}
		}
	}
	return m, nil
}

// Set runs SET key value, with PX expiration when expiration > 0 and
// KEEPTTL when it is redis.KeepTTL, if w is current for its scope.
func (g *Guard) Set(ctx context.Context, w guard.Write, key string, value any, expiration time.Duration) error {
	px := ""
	switch {
	case expiration == redis.KeepTTL:
		px = "KEEPTTL"
	case expiration > 0:
		px = strconv.FormatInt(max(1, expiration.Milliseconds()), 10)
	}
	_, err := g.run(ctx, setScript, w, "set", []string{key}, value, px)
	return err
}

// Del runs DEL keys... if w is current and returns how many keys it removed.
func (g *Guard) Del(ctx context.Context, w guard.Write, keys ...string) (int64, error) {
	if len(keys) == 0 {
		return 0, &fence.InvalidError{Field: "keys", Reason: "del needs at least one key"}
	}
	r, err := g.run(ctx, delScript, w, "del", keys)
	n, _ := r.(int64)
	return n, err
}

// HSet runs HSET key field value [field value ...] if w is current and
// returns how many fields it added. values are field, value pairs.
func (g *Guard) HSet(ctx context.Context, w guard.Write, key string, values ...any) (int64, error) {
	if len(values) == 0 || len(values)%2 != 0 {
		return 0, &fence.InvalidError{Field: "values", Reason: fmt.Sprintf("hset needs field, value pairs, got %d values", len(values))}
	}
	r, err := g.run(ctx, hsetScript, w, "hset", []string{key}, values...)
	n, _ := r.(int64)
	return n, err
}

// IncrBy runs INCRBY key n if w is current and returns the new value.
func (g *Guard) IncrBy(ctx context.Context, w guard.Write, key string, n int64) (int64, error) {
	r, err := g.run(ctx, incrByScript, w, "incrby", []string{key}, n)
	v, _ := r.(int64)
	return v, err
}

// Eval runs the caller's Lua body in the same script as the fence check,
// if w is current, and returns the body's reply as go-redis decodes it
// (nil for a nil reply). Inside body, KEYS and ARGV are exactly keys and
// args, numbered from 1: the mark key and the token are not visible.
//
// body is the inside of a Lua function, so it returns its reply with
// return and declares variables local. If body raises an error the mark is
// not advanced, but, as always in Redis, the commands body ran before the
// error are not undone. Every key body touches must be passed in keys
// (and, in Redis Cluster, share the scope's hash tag; see Key). The Guard
// keeps one compiled script per distinct body, so pass constant bodies and
// vary args, not the text.
func (g *Guard) Eval(ctx context.Context, w guard.Write, body string, keys []string, args ...any) (any, error) {
	s, ok := g.user.Load(body)
	if !ok {
		s, _ = g.user.LoadOrStore(body, userScript(body))
	}
	return g.run(ctx, s.(*redis.Script), w, "eval", keys, args...)
}

// hashTag returns a key's hash tag as Redis Cluster reads it: the text
// between the first '{' and the next '}', when not empty.
func hashTag(key string) (string, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}

// owns refuses a key that does not belong to scope: by default, one whose
// hash tag is not scope; with WithKeyScope, one that f gives to another
// scope. A token of one scope must never write another scope's data, nor,
// under any token, a mark.
func (g *Guard) owns(scope, key string) error {
	tag, tagged := hashTag(key)
	if key == g.MarkKey(scope) || tagged && key == g.MarkKey(tag) {
		return &fence.InvalidError{Field: "keys", Reason: fmt.Sprintf("%q is a fencing mark, which only the guard writes", key)}
	}
	if g.cfg.keyScope != nil {
		if s := g.cfg.keyScope(key); s != scope {
			return fmt.Errorf("%w: key %q belongs to scope %q; a token of scope %q writes only the keys WithKeyScope gives to it",
				guard.ErrWrongScope, key, s, scope)
		}
		return nil
	}
	if tagged && tag == scope {
		return nil
	}
	allowed := fmt.Sprintf("a token of scope %q writes only keys tagged {%s}, such as %q (see Key)", scope, scope, Key(scope, "name"))
	if !tagged {
		return fmt.Errorf("%w: key %q has no hash tag; %s", guard.ErrWrongScope, key, allowed)
	}
	return fmt.Errorf("%w: key %q belongs to scope %q; %s", guard.ErrWrongScope, key, tag, allowed)
}

// run validates w, runs a fenced script and decodes its reply.
func (g *Guard) run(ctx context.Context, s *redis.Script, w guard.Write, op string, keys []string, args ...any) (any, error) {
	if g.cfg.verify != nil {
		if err := g.cfg.verify.Verify(w.Token); err != nil {
			return nil, err
		}
	}
	for _, k := range keys {
		if err := g.owns(w.Token.Scope, k); err != nil {
			return nil, err
		}
	}
	r, err := run(ctx, g.rdb, g.cfg.prefix, s, w, g.cfg.strict, keys, args...)
	var stale *guard.StaleError
	switch {
	case err == nil:
		if g.cfg.obs != nil {
			g.cfg.obs.Accepted(w.Token.Scope)
		}
	case errors.As(err, &stale):
		if g.cfg.obs != nil {
			g.cfg.obs.Rejected(stale)
		}
		logStale(ctx, g.cfg.log, stale)
	default:
		err = fmt.Errorf("fenced %s on %q: %w", op, w.Token.Scope, err)
	}
	return r, err
}

func logStale(ctx context.Context, l *slog.Logger, stale *guard.StaleError) {
	l.LogAttrs(ctx, slog.LevelWarn, "stale write rejected",
		slog.String("scope", stale.Scope),
		slog.Uint64("presented_token", stale.Presented),
		slog.Uint64("highest_token", stale.Highest),
		slog.Uint64("presented_seq", stale.PresentedSeq),
		slog.Uint64("highest_seq", stale.HighestSeq),
	)
}

func validate(w guard.Write) error {
	if w.Token.Scope == "" {
		return &fence.InvalidError{Field: "scope", Reason: "the write's token has no scope"}
	}
	if w.Token.Value == 0 || w.Token.Value > fence.MaxToken {
		return &fence.InvalidError{Field: "token", Reason: fmt.Sprintf("value %d is outside 1 to %d", w.Token.Value, uint64(fence.MaxToken))}
	}
	return nil
}

// run runs s for w. KEYS are the mark then keys; ARGV the token, the
// sequence, the strict flag, then args. It returns the write's reply, a
// *guard.StaleError, or the Redis error.
func run(ctx context.Context, rdb redis.UniversalClient, prefix string, s *redis.Script, w guard.Write, strict bool, keys []string, args ...any) (any, error) {
	if err := validate(w); err != nil {
		return nil, err
	}
	k := make([]string, 0, 1+len(keys))
	k = append(k, prefix+"{"+w.Token.Scope+"}")
	k = append(k, keys...)
	st := "0"
	if strict {
		st = "1"
	}
	a := make([]any, 0, 3+len(args))
	a = append(a, strconv.FormatUint(w.Token.Value, 10), strconv.FormatUint(w.Seq, 10), st)
	a = append(a, args...)
	v, err := s.Run(ctx, rdb, k, a...).Result()
	if err != nil {
		return nil, err
	}
	reply, ok := v.([]any)
	if !ok || len(reply) == 0 {
		return nil, fmt.Errorf("unexpected script reply %v", v)
	}
	switch reply[0] {
	case "ok":
		if len(reply) < 2 {
			return nil, nil
		}
		return reply[1], nil
	case "stale":
		if len(reply) == 3 {
			ht, err1 := parseReply(reply[1])
			hs, err2 := parseReply(reply[2])
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("unexpected stale reply %v: %w", v, err)
			}
			return nil, &guard.StaleError{Scope: w.Token.Scope, Presented: w.Token.Value, Highest: ht, PresentedSeq: w.Seq, HighestSeq: hs}
		}
	}
	return nil, fmt.Errorf("unexpected script reply %v", v)
}

func parseReply(v any) (uint64, error) {
	s, ok := v.(string)
	if !ok {
		return 0, fmt.Errorf("%v is not a decimal string", v)
	}
	return strconv.ParseUint(s, 10, 64)
}

// Store is a guard.Store whose marks live in Redis, for a guard.Guard whose
// writes go somewhere other than that Redis (for Redis data use Guard: its
// writes are atomic with the check). It is safe for concurrent use.
//
// Fence checks the mark with one script, calls apply, then checks again and
// records the new mark with a second script. Fence calls for one scope on
// one Store are serialized by a lock in this process; the Redis mark makes
// the fence durable and shared, but it cannot serialize apply across
// processes. Use one Store per scope per resource: if two processes run
// Fence for the same scope, a write of one may be applied while the other
// advances the mark, and Fence can then only report it afterwards (an
// error wrapping the *guard.StaleError, returned after apply ran).
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	scopes sync.Map // scope → *sync.Mutex
}

// NewStore returns a Store that keeps marks in rdb. Only WithPrefix
// applies; strictness, logging and observers belong to the guard.Guard.
func NewStore(rdb redis.UniversalClient, opts ...Option) *Store {
	return &Store{rdb: rdb, prefix: newConfig(opts).prefix}
}

// Scopes implements guard.Lister: the scopes starting with prefix that
// have a mark, found with SCAN (on every master of a Redis Cluster).
func (s *Store) Scopes(ctx context.Context, prefix string) ([]string, error) {
	start := s.prefix + "{"
	match := globEscaper.Replace(start+prefix) + "*}"
	var mu sync.Mutex
	var scopes []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			scope := strings.TrimSuffix(strings.TrimPrefix(iter.Val(), start), "}")
			mu.Lock()
			scopes = append(scopes, scope)
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := s.rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("a %T cannot be scanned; give a *redis.Client or *redis.ClusterClient", s.rdb)
	}
	if err != nil {
		return nil, fmt.Errorf("redisguard: list the scopes under %q: %w", prefix, err)
	}
	return scopes, nil
}

// globEscaper quotes the characters special in a SCAN pattern.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)

// ErrSuperseded reports that Store.Fence applied a write and then found
// that another process had advanced the scope's mark past it meanwhile. It
// wraps fence.ErrStale; the error returned also carries the
// *guard.StaleError.
var ErrSuperseded = fmt.Errorf("%w: superseded while applying", fence.ErrStale)

// Fence implements guard.Store.
func (s *Store) Fence(ctx context.Context, w guard.Write, strict bool, apply func(ctx context.Context) error) error {
	mu, ok := s.scopes.Load(w.Token.Scope)
	if !ok {
		mu, _ = s.scopes.LoadOrStore(w.Token.Scope, new(sync.Mutex))
	}
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if _, err := run(ctx, s.rdb, s.prefix, checkScript, w, strict, nil); err != nil {
		return err
	}
	if err := apply(ctx); err != nil {
		return err
	}
	_, err := run(ctx, s.rdb, s.prefix, advanceScript, w, strict, nil)
	var stale *guard.StaleError
	if errors.As(err, &stale) {
		return fmt.Errorf("%w: %w", ErrSuperseded, stale)
	}
	if err != nil {
		return fmt.Errorf("record mark for %q after applying: %w", w.Token.Scope, err)
	}
	return nil
}

// Highest returns the highest mark recorded for scope (zero if none).
func (s *Store) Highest(ctx context.Context, scope string) (guard.Mark, error) {
	return highest(ctx, s.rdb, s.prefix+"{"+scope+"}")
}
